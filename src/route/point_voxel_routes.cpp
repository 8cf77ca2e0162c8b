// The point <-> voxel route table (voxelize, devoxelize, build_point_voxel_map; every pass).
// Each row's admit() matches the Constraints comment of its kernel file under
// src/backend/<device>/point_voxel/.
#include "route/route_table.h"

namespace lattice {

namespace {

using route_detail::needs_cpu;
using route_detail::needs_cuda;
using route_detail::needs_float;
using route_detail::RouteSpec;

// Features of any float dtype; the map pass reads points, which must be float32 or float64.
Verdict needs_supported_dtype(const PointVoxelProblem& p) {
  if (p.pass == PointVoxelPass::build_map) {
    if (p.dtype != Dtype::f32 && p.dtype != Dtype::f64)
      return Verdict::no("needs float32 or float64 points, got " + std::string(to_string(p.dtype)));
    return Verdict::ok();
  }
  return needs_float(p.dtype);
}

// src/backend/cuda/point_voxel/point_voxel.cu: every pass, the same dtypes as the CPU routes.
Verdict admit_point_voxel_cuda(const PointVoxelProblem& p, const DeviceCaps& caps) {
  if (auto v = needs_cuda(p.device, caps); !v.admitted) return v;
  return needs_supported_dtype(p);
}

Verdict admit_point_voxel_parallel(const PointVoxelProblem& p, const DeviceCaps&) {
  if (auto v = needs_cpu(p.device); !v.admitted) return v;
  return needs_supported_dtype(p);
}

Verdict admit_point_voxel_reference(const PointVoxelProblem& p, const DeviceCaps&) {
  if (auto v = needs_cpu(p.device); !v.admitted) return v;
  return needs_supported_dtype(p);
}

constexpr std::array<RouteSpec<PointVoxelProblem>, 3> kPointVoxelRoutes{{
    {RouteId::point_voxel_cuda, 0, admit_point_voxel_cuda},
    {RouteId::point_voxel_parallel, 1, admit_point_voxel_parallel},
    {RouteId::point_voxel_reference, 9, admit_point_voxel_reference},
}};

}  // namespace

Explanation explain(const PointVoxelProblem& problem, const DeviceCaps& caps,
                    const RoutePolicy& policy) {
  return route_detail::run_table(kPointVoxelRoutes, problem, caps, policy);
}

}  // namespace lattice
