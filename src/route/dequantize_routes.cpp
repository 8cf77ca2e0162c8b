// The dequantize route table: the packed-weight decoder (dequantize_weight, and the dequant_reference route of family quantized before its float conv). Each row's admit() matches the Constraints comment of its
// kernel file (src/backend/cpu/quantized/decode.cpp, src/backend/cuda/quantized/decode.cpp).
#include "route/route_table.h"

namespace lattice {

namespace {

using route_detail::RouteSpec;

// Every packed format and output dtype, CPU weights.
Verdict admit_dequantize_reference(const DequantizeProblem& p, const DeviceCaps&) { return route_detail::needs_cpu(p.device); }

// Every packed format and output dtype, weights on a CUDA device of this build.
Verdict admit_dequantize_cuda(const DequantizeProblem& p, const DeviceCaps& caps) { return route_detail::needs_cuda(p.device, caps); }

constexpr std::array<RouteSpec<DequantizeProblem>, 2> kRoutes{{
    {{.id = RouteId::dequantize_cuda,
      .family = "dequantize",
      .name = "cuda",
      .device = "cuda",
      .tier = GpuTier::classic,
      .rank = 0,
      .kernels = "cuda::dequantize_cuda",
      .files = {{{"src/backend/cuda/quantized/decode.cpp",
          "CUDA (data on a cuda device, the CUDA backend built and a device present); a packed "
          "affine int4 / int8 weight (bits 4 / 8, group 32 / 64 / 128, scales f16 / bf16 / f32) "
          "decoded whole to (K, C_in, C_out) of any float dtype (f16, bf16, f32, f64). "
          "Deterministic (elementwise, no atomics): the CPU reference route's values, bit for bit."}}}},
     admit_dequantize_cuda},
    {{.id = RouteId::dequantize_reference,
      .family = "dequantize",
      .name = "reference",
      .device = "cpu",
      .tier = GpuTier::none,
      .rank = 9,
      .kernels = "cpu::dequantize_reference",
      .files = {{{"src/backend/cpu/quantized/decode.cpp",
          "CPU; a packed affine int4 / int8 weight (bits 4 / 8, group 32 / 64 / 128, scales f16 / "
          "bf16 / f32) decoded whole to (K, C_in, C_out) of any float dtype (f16, bf16, f32, f64). "
          "Deterministic (elementwise)."}}}},
     admit_dequantize_reference},
}};

}  // namespace

void route_detail::dequantize_route_infos(std::vector<RouteInfo>& out) { route_detail::append_infos(out, kRoutes); }

Explanation explain(const DequantizeProblem& problem, const DeviceCaps& caps, const RoutePolicy& policy) {
  return route_detail::run_table(kRoutes, problem, caps, policy);
}

std::optional<RouteId> select(const DequantizeProblem& problem, const DeviceCaps& caps, const RoutePolicy& policy) {
  return route_detail::decide_table(kRoutes, problem, caps, policy);
}

}  // namespace lattice
