// The convolution route table. Each row's admit() matches the Constraints comment of its
// kernel file under src/backend/<device>/conv/.
#include "lattice/route/tuning.h"
#include "route/route_table.h"

#include <cstdio>

namespace lattice {

namespace {

using route_detail::needs_cpu;
using route_detail::needs_cuda;
using route_detail::needs_float;
using route_detail::RouteSpec;

// The pointwise routes (CPU and CUDA): a 1x1x1 kernel onto the input's own rows, i.e. a matmul.
Verdict needs_identity_1x1(const ConvProblem& p) {
  if (p.kernel_volume != 1)
    return Verdict::no("needs kernel volume 1, got " + std::to_string(p.kernel_volume));
  if (!p.identity_relation)
    return Verdict::no("needs the identity relation (output rows == input rows), got a " +
                       std::string(to_string(p.relation)) + " relation that moves rows");
  return Verdict::ok();
}

// The cuBLAS routes' dtypes: f16, bf16 or f32 (cuBLAS has no f32-accumulating f64 path here).
Verdict needs_cuda_float(Dtype dtype) {
  if (dtype != Dtype::f16 && dtype != Dtype::bf16 && dtype != Dtype::f32)
    return Verdict::no("needs float16, bfloat16 or float32 (float64 convolutions run on cpu), got " +
                       std::string(to_string(dtype)));
  return Verdict::ok();
}

Verdict admit_conv_pointwise_matmul(const ConvProblem& p, const DeviceCaps&) {
  if (auto v = needs_cpu(p.device); !v.admitted) return v;
  if (auto v = needs_float(p.dtype); !v.admitted) return v;
  return needs_identity_1x1(p);
}

Verdict admit_conv_gather_gemm_scatter(const ConvProblem& p, const DeviceCaps& caps) {
  if (auto v = needs_cpu(p.device); !v.admitted) return v;
  if (auto v = needs_float(p.dtype); !v.admitted) return v;
  if (caps.cpu.blas.empty()) return Verdict::no("needs a BLAS library; this build has none");
  return Verdict::ok();
}

// src/backend/cuda/conv/pointwise_matmul.cu
Verdict admit_conv_cuda_pointwise_matmul(const ConvProblem& p, const DeviceCaps& caps) {
  if (auto v = needs_cuda_float(p.dtype); !v.admitted) return v;
  if (auto v = needs_identity_1x1(p); !v.admitted) return v;
  return needs_cuda(p.device, caps);
}

// src/backend/cuda/conv/implicit_gemm_sm80.cu
Verdict admit_conv_implicit_gemm_sm80(const ConvProblem& p, const DeviceCaps& caps) {
  if (p.dtype != Dtype::f16 && p.dtype != Dtype::bf16 && p.dtype != Dtype::f32)
    return Verdict::no("needs float16 or bfloat16 (or float32 with allow_tf32), got " +
                       std::string(to_string(p.dtype)));
  if (p.dtype == Dtype::f32 && !p.allow_tf32)
    return Verdict::no("float32 needs allow_tf32=True (tf32 tensor cores), got allow_tf32=False");
  return needs_cuda(p.device, caps, GpuTier::tensor_core);
}

// src/backend/cuda/conv/gather_gemm_scatter.cu
Verdict admit_conv_cuda_gather_gemm_scatter(const ConvProblem& p, const DeviceCaps& caps) {
  if (auto v = needs_cuda_float(p.dtype); !v.admitted) return v;
  return needs_cuda(p.device, caps);
}

Verdict admit_conv_reference(const ConvProblem& p, const DeviceCaps&) {
  if (auto v = needs_cpu(p.device); !v.admitted) return v;
  return needs_float(p.dtype);
}

constexpr std::array<RouteSpec<ConvProblem>, 6> kConvRoutes{{
    {{.id = RouteId::conv_pointwise_matmul,
      .family = "conv",
      .name = "pointwise_matmul",
      .device = "cpu",
      .tier = GpuTier::none,
      .rank = 0,
      .kernels = "cpu::conv_pointwise_matmul_forward cpu::conv_pointwise_matmul_input_grad cpu::conv_pointwise_matmul_weight_grad cpu::conv_reference_bias_grad",
      .files = {{{"src/backend/cpu/conv/pointwise_matmul.cpp",
          "CPU; kernel volume 1; identity relation (edges exactly (i, i, 0) for every row, "
          "so n_in == n_out); float dtypes (f16, bf16, f32, f64). Deterministic."}}}},
     admit_conv_pointwise_matmul},
    {{.id = RouteId::conv_gather_gemm_scatter,
      .family = "conv",
      .name = "gather_gemm_scatter",
      .device = "cpu",
      .tier = GpuTier::none,
      .rank = 1,
      .kernels = "cpu::conv_gather_gemm_scatter_forward cpu::conv_gather_gemm_scatter_input_grad cpu::conv_gather_gemm_scatter_weight_grad cpu::conv_reference_bias_grad",
      .files = {{{"src/backend/cpu/conv/gather_gemm_scatter.cpp",
          "CPU; float dtypes (f16, bf16, f32, f64); any relation kind, any kernel volume, "
          "any edge count. Deterministic: bitwise-identical results for the same inputs and build."}}}},
     admit_conv_gather_gemm_scatter},
    {{.id = RouteId::conv_cuda_pointwise_matmul,
      .family = "conv",
      .name = "cuda_pointwise_matmul",
      .device = "cuda",
      .tier = GpuTier::classic,
      .rank = 2,
      .kernels = "cuda::conv_cuda_pointwise_matmul_forward cuda::conv_cuda_pointwise_matmul_input_grad cuda::conv_cuda_pointwise_matmul_weight_grad cuda::conv_cuda_bias_grad",
      .files = {{{"src/backend/cuda/conv/pointwise_matmul.cu",
          "CUDA device (any tier, classic or above); kernel volume 1; identity relation "
          "(edges exactly (i, i, 0) for every row, so n_in == n_out); f16, bf16 or f32 (f32 GEMMs use "
          "tf32 only with allow_tf32). Deterministic: bitwise-identical results for the same inputs, "
          "device and build."}}}},
     admit_conv_cuda_pointwise_matmul},
    {{.id = RouteId::conv_implicit_gemm_sm80,
      .family = "conv",
      .name = "implicit_gemm_sm80",
      .device = "cuda",
      .tier = GpuTier::tensor_core,
      .rank = 3,
      .kernels = "cuda::conv_implicit_gemm_sm80_forward cuda::conv_implicit_gemm_sm80_input_grad cuda::conv_implicit_gemm_sm80_weight_grad cuda::conv_cuda_bias_grad",
      .files = {{{"src/backend/cuda/conv/implicit_gemm_sm80.cu",
          "CUDA device of tier tensor_core or above (sm_80+); f16 or bf16, or f32 only with "
          "allow_tf32 (tf32 tensor cores); any relation kind, any kernel volume, any edge count, any "
          "channel counts (tiles are guarded, no multiple-of-8 requirement; 16-byte vector copies only "
          "when the channel counts and pointers allow, element loads otherwise). Deterministic: "
          "bitwise-identical results for the same inputs, device and build (no float atomics; an integer "
          "shared-memory OR builds each tile's offset mask)."}}}},
     admit_conv_implicit_gemm_sm80},
    {{.id = RouteId::conv_cuda_gather_gemm_scatter,
      .family = "conv",
      .name = "cuda_gather_gemm_scatter",
      .device = "cuda",
      .tier = GpuTier::classic,
      .rank = 4,
      .kernels = "cuda::conv_cuda_gather_gemm_scatter_forward cuda::conv_cuda_gather_gemm_scatter_input_grad cuda::conv_cuda_gather_gemm_scatter_weight_grad cuda::conv_cuda_bias_grad",
      .files = {{{"src/backend/cuda/conv/gather_gemm_scatter.cu",
          "CUDA device (any tier, classic or above); f16, bf16 or f32 (not f64: cuBLAS has "
          "no f32-accumulating f64 path here and the CPU routes cover f64); any relation kind, any kernel "
          "volume, any edge count, any channel counts. f32 GEMMs use tf32 only with allow_tf32. "
          "Deterministic: bitwise-identical results for the same inputs, device and build."}}}},
     admit_conv_cuda_gather_gemm_scatter},
    {{.id = RouteId::conv_reference,
      .family = "conv",
      .name = "reference",
      .device = "cpu",
      .tier = GpuTier::none,
      .rank = 9,
      .kernels = "cpu::conv_reference_forward cpu::conv_reference_input_grad cpu::conv_reference_weight_grad cpu::conv_reference_bias_grad",
      .files = {{{"src/backend/cpu/conv/reference.cpp",
          "CPU; any float dtype (f16, bf16, f32, f64); any relation kind, any kernel volume, "
          "any edge count (including none). Deterministic (single-threaded, fixed summation order)."}}}},
     admit_conv_reference},
}};

// What each route's kernels read from the relation, per pass (RelationView fields they
// dereference or test; ops::relation_view fills exactly these, so a relation builds nothing
// else; bias gradients read n_out alone). A field missing here is null in the view, so a CPU
// route that read more would fail in every CPU conv test; the CUDA rows are checked by the CUDA
// parity suite.
unsigned relation_reads(RouteId route, ConvPass pass) {
  switch (route) {
    case RouteId::conv_pointwise_matmul:  // the identity flag and the row counts only
    case RouteId::conv_cuda_pointwise_matmul:
      return 0;
    case RouteId::conv_gather_gemm_scatter:  // gather_gemm_scatter.cpp
      switch (pass) {
        case ConvPass::forward: return kViewEdgeCount | kViewOutPtr | kViewOffsetGrouping;
        case ConvPass::input_grad: return kViewEdgeCount | kViewOffsetGrouping | kViewInputGrouping;
        case ConvPass::weight_grad: return kViewEdgeCount | kViewOffsetGrouping;
      }
      break;
    case RouteId::conv_implicit_gemm_sm80:  // implicit_gemm_sm80.cu
      switch (pass) {
        // The map and its tile order alone (the count is not read: 0 in the view; the tile
        // shape uses known_edges when the relation already knows it).
        case ConvPass::forward: return kViewGemmMap | kViewGemmOrder;
        // The input-side map and its order (the count decides the all-zero shortcut).
        case ConvPass::input_grad: return kViewEdgeCount | kViewInputGemmMap | kViewInputGemmOrder;
        case ConvPass::weight_grad: return kViewEdgeCount | kViewOffsetGrouping;
      }
      break;
    case RouteId::conv_cuda_gather_gemm_scatter:  // gather_gemm_scatter.cu: per-offset GEMMs
      return kViewEdgeCount | kViewOffsetGrouping | kViewHostKPtr;
    case RouteId::conv_reference:  // reference.cpp
      switch (pass) {
        case ConvPass::forward: return kViewOutPtr | kViewEdgeList;
        case ConvPass::input_grad: return kViewEdgeCount | kViewEdgeList;
        case ConvPass::weight_grad: return kViewEdgeCount | kViewOffsetGrouping;
      }
      break;
    default:
      break;
  }
  return kViewAll;
}

}  // namespace

void route_detail::conv_route_infos(std::vector<RouteInfo>& out) { route_detail::append_infos(out, kConvRoutes); }

namespace {

// The measurement behind a recorded choice, for explain(): "'a' 0.120 ms, 'b' 0.340 ms, 'c' failed (...)".
std::string describe_times(const TunedChoice& t) {
  std::string s;
  for (const TunedTime& m : t.times) {
    if (!s.empty()) s += ", ";
    s += "'" + std::string(to_string(m.route)) + "' ";
    if (m.ms >= 0) {
      char ms[32];
      std::snprintf(ms, sizeof ms, "%.3f ms", m.ms);
      s += ms;
    } else {
      s += "failed (" + m.error + ")";
    }
  }
  return s;
}

bool uses_tuned(const RoutePolicy& policy) { return !policy.force && policy.use_tuned && tuned_count() > 0; }

}  // namespace

Explanation explain(const ConvProblem& problem, const DeviceCaps& caps, const RoutePolicy& policy) {
  Explanation e = route_detail::run_table(kConvRoutes, problem, caps, policy);
  if (!uses_tuned(policy)) return e;
  const std::string key = conv_tuning_key(problem, caps);
  const std::optional<TunedChoice> t = find_tuned(key);
  if (!t) return e;
  const RouteRow* row = e.row(t->route);
  e.tuned = "measured for bucket [" + key + "]: " + describe_times(*t) + "; fastest '" +
            std::string(to_string(t->route)) + "'";
  if (row && row->verdict.admitted) {
    e.chosen = t->route;
    e.tuned_chosen = true;
  } else {
    e.tuned += ", not admitted for this call (" + (row ? row->verdict.reason : std::string("not a conv route")) +
               "): the rank order decides";
  }
  return e;
}

std::optional<RouteId> select(const ConvProblem& problem, const DeviceCaps& caps, const RoutePolicy& policy) {
  if (uses_tuned(policy)) {
    if (const std::optional<TunedChoice> t = find_tuned(conv_tuning_key(problem, caps))) {
      for (const auto& spec : kConvRoutes)
        if (spec.info.id == t->route && spec.admit(problem, caps).admitted) return spec.info.id;
    }
  }
  return route_detail::decide_table(kConvRoutes, problem, caps, policy);
}

unsigned conv_relation_reads(RouteId route, ConvPass pass) { return relation_reads(route, pass); }

}  // namespace lattice
