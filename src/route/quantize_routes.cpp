// The point -> voxel quantization route table.
#include "route/route_table.h"

namespace lattice {

namespace {

using route_detail::needs_cpu;
using route_detail::needs_cuda;
using route_detail::RouteSpec;

Verdict admit_quantize_reference(const QuantizeProblem& p, const DeviceCaps&) {
  if (auto v = needs_cpu(p.device); !v.admitted) return v;
  if (p.dtype != Dtype::f32 && p.dtype != Dtype::f64)
    return Verdict::no("needs float32 or float64 points, got " + std::string(to_string(p.dtype)));
  return Verdict::ok();
}

// src/backend/cuda/point_voxel/quantize.cu: float32 / float64 points on a CUDA device.
Verdict admit_quantize_cuda(const QuantizeProblem& p, const DeviceCaps& caps) {
  if (auto v = needs_cuda(p.device, caps); !v.admitted) return v;
  if (p.dtype != Dtype::f32 && p.dtype != Dtype::f64)
    return Verdict::no("needs float32 or float64 points, got " + std::string(to_string(p.dtype)));
  return Verdict::ok();
}

constexpr std::array<RouteSpec<QuantizeProblem>, 2> kQuantizeRoutes{{
    {{.id = RouteId::quantize_cuda,
      .family = "quantize",
      .name = "cuda",
      .device = "cuda",
      .tier = GpuTier::classic,
      .rank = 0,
      .kernels = "cuda::quantize",
      .files = {{{"src/backend/cuda/point_voxel/quantize.cu",
          "CUDA device (needs_cuda: a CUDA build with a device); points float32 or float64 "
          "(P, 3); optional int32 batch ids (P); any P (below 2^30). Deterministic: the same coordinates, "
          "inverse and counts as the CPU reference (unique voxel rows in first-occurrence order), bit for "
          "bit, on every run."}}}},
     admit_quantize_cuda},
    {{.id = RouteId::quantize_reference,
      .family = "quantize",
      .name = "reference",
      .device = "cpu",
      .tier = GpuTier::none,
      .rank = 9,
      .kernels = "cpu::quantize_reference",
      .files = {{{"src/backend/cpu/quantize/reference.cpp",
          "CPU; points float32 or float64 (P, 3); optional int32 batch ids (P); any P. "
          "Single pass in point order, so voxel rows come out in first-occurrence order. Quantization "
          "is computed in float64: v = floor((p - origin) / voxel_size) (backend/common/point_voxel.h). "
          "With drop_invalid, points with a NaN/inf coordinate are skipped (kept[i] = false) and the "
          "inverse lists the kept points only; otherwise the first such point is reported."}}}},
     admit_quantize_reference},
}};

}  // namespace

void route_detail::quantize_route_infos(std::vector<RouteInfo>& out) { route_detail::append_infos(out, kQuantizeRoutes); }

Explanation explain(const QuantizeProblem& problem, const DeviceCaps& caps, const RoutePolicy& policy) {
  return route_detail::run_table(kQuantizeRoutes, problem, caps, policy);
}

std::optional<RouteId> select(const QuantizeProblem& problem, const DeviceCaps& caps, const RoutePolicy& policy) {
  return route_detail::decide_table(kQuantizeRoutes, problem, caps, policy);
}

}  // namespace lattice
