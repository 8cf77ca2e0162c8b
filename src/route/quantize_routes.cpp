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
    {RouteId::quantize_cuda, 0, admit_quantize_cuda},
    {RouteId::quantize_reference, 9, admit_quantize_reference},
}};

}  // namespace

Explanation explain(const QuantizeProblem& problem, const DeviceCaps& caps, const RoutePolicy& policy) {
  return route_detail::run_table(kQuantizeRoutes, problem, caps, policy);
}

}  // namespace lattice
