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
    {{.id = RouteId::point_voxel_cuda,
      .family = "point_voxel",
      .name = "cuda",
      .device = "cuda",
      .tier = GpuTier::classic,
      .rank = 0,
      .kernels = "cuda::voxelize_forward cuda::voxelize_backward cuda::devoxelize_forward cuda::devoxelize_backward cuda::point_voxel_map",
      .files = {{{"src/backend/cuda/point_voxel/point_voxel.cu",
          "CUDA device (needs_cuda: a CUDA build with a device); features of any float dtype "
          "(f16, bf16, f32, f64); points float32 or float64; any number of points, voxels and channels "
          "(including none); every pass (voxelize forward/backward, devoxelize forward/backward, "
          "build_map). Deterministic: no float atomics; bitwise-identical repeated runs, and the same "
          "per-element summation orders as the CPU routes (backend/kernels.h, PointVoxelKernels), with "
          "round-to-nearest adds and multiplies (no FMA), so the results match them bit for bit."}}}},
     admit_point_voxel_cuda},
    {{.id = RouteId::point_voxel_parallel,
      .family = "point_voxel",
      .name = "parallel",
      .device = "cpu",
      .tier = GpuTier::none,
      .rank = 1,
      .kernels = "cpu::voxelize_parallel_forward cpu::voxelize_parallel_backward cpu::devoxelize_parallel_forward cpu::devoxelize_parallel_backward cpu::point_voxel_map_parallel",
      .files = {{{"src/backend/cpu/point_voxel/parallel.cpp",
          "CPU; features of any float dtype (f16, bf16, f32, f64); points float32 or "
          "float64; any number of points, voxels and channels (including none). Deterministic: "
          "bitwise-identical to the reference route for any thread count (no atomics, no races)."}}}},
     admit_point_voxel_parallel},
    {{.id = RouteId::point_voxel_reference,
      .family = "point_voxel",
      .name = "reference",
      .device = "cpu",
      .tier = GpuTier::none,
      .rank = 9,
      .kernels = "cpu::voxelize_reference_forward cpu::voxelize_reference_backward cpu::devoxelize_reference_forward cpu::devoxelize_reference_backward cpu::point_voxel_map_reference",
      .files = {{{"src/backend/cpu/point_voxel/reference.cpp",
          "CPU; features of any float dtype (f16, bf16, f32, f64); points float32 or "
          "float64; any number of points, voxels and channels (including none). Deterministic "
          "(single-threaded, fixed summation order)."}}}},
     admit_point_voxel_reference},
}};

}  // namespace

void route_detail::point_voxel_route_infos(std::vector<RouteInfo>& out) { route_detail::append_infos(out, kPointVoxelRoutes); }

Explanation explain(const PointVoxelProblem& problem, const DeviceCaps& caps,
                    const RoutePolicy& policy) {
  return route_detail::run_table(kPointVoxelRoutes, problem, caps, policy);
}

std::optional<RouteId> select(const PointVoxelProblem& problem, const DeviceCaps& caps, const RoutePolicy& policy) {
  return route_detail::decide_table(kPointVoxelRoutes, problem, caps, policy);
}

}  // namespace lattice
