// The route table of packed affine int4/int8 weights (family "quantized"): the forward pass of
// linear and of every convolution kind with a QuantizedWeight. Each row's admit() matches the
// Constraints comment of its kernel file under src/backend/cpu/quantized/ or
// src/backend/cuda/quantized/.
#include <cstdio>

#include "route/route_table.h"

namespace lattice {

std::string to_string(const QuantizedProblem& p) {
  std::string s = p.op + " forward: int" + std::to_string(p.bits) + " weight (group " +
                  std::to_string(p.group_size) + ", " + std::string(to_string(p.scale_dtype)) + " scales), ";
  if (p.has_relation) {
    char avg[32];
    std::snprintf(avg, sizeof avg, "%.2f", p.n_out ? static_cast<double>(p.n_edges) / p.n_out : 0.0);
    s += std::string(to_string(p.relation)) + " relation, " + std::string(to_string(p.dtype)) + " on " +
         to_string(p.device) + ", N_in=" + std::to_string(p.n_in) + " N_out=" + std::to_string(p.n_out) +
         " C_in=" + std::to_string(p.c_in) + " C_out=" + std::to_string(p.c_out) +
         " K=" + std::to_string(p.kernel_volume) + " edges=" + std::to_string(p.n_edges) + " (" + avg +
         " per output row)" + (p.identity_relation ? ", identity relation" : "");
  } else {
    s += "rows " + std::string(to_string(p.dtype)) + " on " + to_string(p.device) +
         ", N=" + std::to_string(p.n_in) + " C_in=" + std::to_string(p.c_in) +
         " C_out=" + std::to_string(p.c_out);
  }
  return s;
}

namespace {

using route_detail::needs_cpu;
using route_detail::needs_cuda;
using route_detail::needs_float;
using route_detail::RouteSpec;

// src/backend/cuda/quantized/decode_conv.cpp
Verdict admit_cuda_decode_conv(const QuantizedProblem& p, const DeviceCaps& caps) {
  if (auto v = needs_cuda(p.device, caps); !v.admitted) return v;
  if (p.dtype != Dtype::f32 && p.dtype != Dtype::f16 && p.dtype != Dtype::bf16)
    return Verdict::no("needs float32, float16 or bfloat16 activations, got " + std::string(to_string(p.dtype)));
  return Verdict::ok();
}

// src/backend/cuda/quantized/dequant_gemm.cu
Verdict admit_cuda_dequant_gemm(const QuantizedProblem& p, const DeviceCaps& caps) {
  if (auto v = needs_cuda(p.device, caps); !v.admitted) return v;
  if (p.dtype != Dtype::f32 && p.dtype != Dtype::f16 && p.dtype != Dtype::bf16)
    return Verdict::no("needs float32, float16 or bfloat16 activations, got " + std::string(to_string(p.dtype)));
  return Verdict::ok();
}

Verdict admit_fused_dequant_gemm(const QuantizedProblem& p, const DeviceCaps& caps) {
  if (auto v = needs_cpu(p.device); !v.admitted) return v;
  if (p.dtype != Dtype::f32 && p.dtype != Dtype::f16 && p.dtype != Dtype::bf16)
    return Verdict::no("needs float32, float16 or bfloat16 activations, got " + std::string(to_string(p.dtype)));
  if (caps.cpu.blas.empty()) return Verdict::no("needs a BLAS library; this build has none");
  return Verdict::ok();
}

// src/backend/cpu/quantized/dequant_reference.cpp (CPU data) and
// src/backend/cuda/quantized/dequant_reference.cu (CUDA data: f32 / f16 / bf16, the dtypes of
// the float CUDA conv routes that run next).
Verdict admit_dequant_reference(const QuantizedProblem& p, const DeviceCaps& caps) {
  if (p.device.is_cuda()) {
    if (auto v = needs_cuda(p.device, caps); !v.admitted) return v;
    if (p.dtype != Dtype::f32 && p.dtype != Dtype::f16 && p.dtype != Dtype::bf16)
      return Verdict::no("on cuda needs float32, float16 or bfloat16 activations (float64 runs on cpu), got " +
                         std::string(to_string(p.dtype)));
    return Verdict::ok();
  }
  if (auto v = needs_cpu(p.device); !v.admitted) return v;
  return needs_float(p.dtype);
}

constexpr std::array<RouteSpec<QuantizedProblem>, 4> kQuantizedRoutes{{
    {{.id = RouteId::quantized_cuda_decode_conv,
      .family = "quantized",
      .name = "cuda_decode_conv",
      .device = "cuda",
      .tier = GpuTier::classic,
      .rank = 0,
      .kernels = "cuda::quantized_cuda_dequantize",
      .files = {{{"src/backend/cuda/quantized/decode_conv.cpp",
          "CUDA device (any tier, classic or above); float32, float16 or bfloat16 "
          "activations; any relation kind (and linear), any kernel volume, edge count and channel counts; "
          "bits 4 / 8, group 32 / 64 / 128, scales f16 / bf16 / f32. Forward only. Deterministic: the "
          "decoded weight is dequantize_weight()'s, bit for bit, and the float route that runs on it is "
          "deterministic."}}}},
     admit_cuda_decode_conv},
    {{.id = RouteId::quantized_cuda_dequant_gemm,
      .family = "quantized",
      .name = "cuda_dequant_gemm",
      .device = "cuda",
      .tier = GpuTier::classic,
      .rank = 1,
      .kernels = "cuda::quantized_cuda_dequant_gemm_forward cuda::quantized_cuda_dequantize",
      .files = {{{"src/backend/cuda/quantized/dequant_gemm.cu",
          "CUDA device (any tier, classic or above); float32, float16 or bfloat16 "
          "activations; any relation kind (and linear: rows times W, no relation), any kernel volume, any "
          "edge count (n_out = 0 and rows without edges included), any channel counts (tiles guarded, no "
          "multiple-of-tile or multiple-of-group requirement); bits 4 / 8, group 32 / 64 / 128, scales "
          "f16 / bf16 / f32. Forward only. Deterministic: bitwise-identical results for the same inputs, "
          "device and build (no atomics)."}}}},
     admit_cuda_dequant_gemm},
    {{.id = RouteId::quantized_fused_dequant_gemm,
      .family = "quantized",
      .name = "fused_dequant_gemm",
      .device = "cpu",
      .tier = GpuTier::none,
      .rank = 0,
      .kernels = "cpu::quantized_fused_dequant_gemm_forward",
      .files = {{{"src/backend/cpu/quantized/fused_dequant_gemm.cpp",
          "CPU; float32, float16 or bfloat16 activations; a BLAS library in the build; any "
          "relation kind (and linear: rows times W, no relation), any kernel volume, bits 4 / 8, group 32 / "
          "64 / 128, scales f16 / bf16 / f32. Forward only. Deterministic."}}}},
     admit_fused_dequant_gemm},
    {{.id = RouteId::quantized_dequant_reference,
      .family = "quantized",
      .name = "dequant_reference",
      .device = "cpu, cuda",
      .tier = GpuTier::classic,
      .rank = 9,
      .kernels = "cpu::quantized_dequantize_reference cuda::quantized_cuda_dequantize",
      .files = {{{"src/backend/cpu/quantized/dequant_reference.cpp",
          "CPU (this file; CUDA data: src/backend/cuda/quantized/dequant_reference.cu); any "
          "float activation dtype (f16, bf16, f32, f64); any relation kind and linear; bits 4 / 8, group "
          "32 / 64 / 128, scales f16 / bf16 / f32. Deterministic."},
         {"src/backend/cuda/quantized/dequant_reference.cu",
          "CUDA device (any tier, classic or above); f32, f16 or bf16 activations as a route "
          "(the float CUDA conv routes that run next have no f64; the decoder itself also writes f64 for "
          "dequantize_kernel_major); any relation kind and linear; bits 4 / 8, group 32 / 64 / 128, scales "
          "f16 / bf16 / f32. Deterministic (elementwise, no atomics)."}}}},
     admit_dequant_reference},
}};

}  // namespace

void route_detail::quantized_route_infos(std::vector<RouteInfo>& out) { route_detail::append_infos(out, kQuantizedRoutes); }

Explanation explain(const QuantizedProblem& problem, const DeviceCaps& caps, const RoutePolicy& policy) {
  return route_detail::run_table(kQuantizedRoutes, problem, caps, policy);
}

std::optional<RouteId> select(const QuantizedProblem& problem, const DeviceCaps& caps, const RoutePolicy& policy) {
  return route_detail::decide_table(kQuantizedRoutes, problem, caps, policy);
}

}  // namespace lattice
