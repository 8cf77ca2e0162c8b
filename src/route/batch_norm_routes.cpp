// The batch norm (+ fused ReLU) route table. Each row's admit() matches the Constraints comment
// of its kernel file (src/backend/cpu/batch_norm/{reference,parallel}.cpp,
// src/backend/cuda/batch_norm/blocked.cu).
#include "route/route_table.h"

namespace lattice {

namespace {

using route_detail::needs_cpu;
using route_detail::needs_cuda;
using route_detail::needs_float;
using route_detail::RouteSpec;

Verdict admit_batch_norm_reference(const BatchNormProblem& p, const DeviceCaps&) {
  if (auto v = needs_cpu(p.device); !v.admitted) return v;
  return needs_float(p.dtype);
}

Verdict admit_batch_norm_parallel(const BatchNormProblem& p, const DeviceCaps&) {
  if (auto v = needs_cpu(p.device); !v.admitted) return v;
  return needs_float(p.dtype);
}

Verdict admit_batch_norm_cuda(const BatchNormProblem& p, const DeviceCaps& caps) {
  if (auto v = needs_cuda(p.device, caps); !v.admitted) return v;
  return needs_float(p.dtype);
}

constexpr std::array<RouteSpec<BatchNormProblem>, 3> kBatchNormRoutes{{
    {{.id = RouteId::batch_norm_cuda,
      .family = "batch_norm",
      .name = "cuda",
      .device = "cuda",
      .tier = GpuTier::classic,
      .rank = 0,
      .kernels = "cuda::batch_norm_cuda_forward cuda::batch_norm_cuda_backward",
      .files = {{{"src/backend/cuda/batch_norm/blocked.cu",
          "CUDA (data on a cuda device, the CUDA backend built and a device present); "
          "features (N, C) of any float dtype (f16, bf16, f32, f64) with per-channel parameters and "
          "statistics in f32 (f64 for f64 features); any N (N >= 2 in training, checked by the "
          "semantic layer), including none, any C; training and eval, forward and backward, "
          "optional fused ReLU and residual input (added before the ReLU). Deterministic: fixed blocks of 32 rows reduced per (block, channel) in "
          "row order, their partials summed in double in a fixed order by one warp per channel (no "
          "atomics), so results are bitwise the same run to run and for any grid; the same order and "
          "arithmetic as the CPU parallel route."}}}},
     admit_batch_norm_cuda},
    {{.id = RouteId::batch_norm_parallel,
      .family = "batch_norm",
      .name = "parallel",
      .device = "cpu",
      .tier = GpuTier::none,
      .rank = 1,
      .kernels = "cpu::batch_norm_parallel_forward cpu::batch_norm_parallel_backward",
      .files = {{{"src/backend/cpu/batch_norm/parallel.cpp",
          "CPU; features (N, C) of any float dtype (f16, bf16, f32, f64) with per-channel "
          "parameters and statistics in f32 (f64 for f64 features); any N (N >= 2 in training, checked "
          "by the semantic layer), including none, any C; training and eval, forward and backward, "
          "optional fused ReLU and residual input (added before the ReLU). Deterministic: "
          "bitwise-identical results for any thread count (fixed "
          "blocks of 32 rows reduced in row order, their partials summed in double in a fixed order)."}}}},
     admit_batch_norm_parallel},
    {{.id = RouteId::batch_norm_reference,
      .family = "batch_norm",
      .name = "reference",
      .device = "cpu",
      .tier = GpuTier::none,
      .rank = 9,
      .kernels = "cpu::batch_norm_reference_forward cpu::batch_norm_reference_backward",
      .files = {{{"src/backend/cpu/batch_norm/reference.cpp",
          "CPU; features (N, C) of any float dtype (f16, bf16, f32, f64) with per-channel "
          "parameters and statistics in f32 (f64 for f64 features); any N (N >= 2 in training), "
          "including none, any C; training and eval, forward and backward, optional fused ReLU and "
          "residual input (added before the ReLU). "
          "Deterministic (single-threaded; per channel two passes over the rows in row order, summed "
          "in double)."}}}},
     admit_batch_norm_reference},
}};

}  // namespace

void route_detail::batch_norm_route_infos(std::vector<RouteInfo>& out) {
  route_detail::append_infos(out, kBatchNormRoutes);
}

Explanation explain(const BatchNormProblem& problem, const DeviceCaps& caps, const RoutePolicy& policy) {
  return route_detail::run_table(kBatchNormRoutes, problem, caps, policy);
}

std::optional<RouteId> select(const BatchNormProblem& problem, const DeviceCaps& caps, const RoutePolicy& policy) {
  return route_detail::decide_table(kBatchNormRoutes, problem, caps, policy);
}

}  // namespace lattice
