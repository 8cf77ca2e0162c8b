// The point_index route table: the index work of the point family (batch id checks, the CSR of points per voxel). Each row's admit() matches the Constraints comment of its
// kernel file (src/backend/cpu/point_voxel/index.cpp, src/backend/cuda/point_voxel/index.cpp).
#include "route/route_table.h"

namespace lattice {

namespace {

using route_detail::RouteSpec;

// Every pass and row count, CPU data.
Verdict admit_point_index_reference(const PointIndexProblem& p, const DeviceCaps&) { return route_detail::needs_cpu(p.device); }

// Every pass and row count, data on a CUDA device of this build.
Verdict admit_point_index_cuda(const PointIndexProblem& p, const DeviceCaps& caps) { return route_detail::needs_cuda(p.device, caps); }

constexpr std::array<RouteSpec<PointIndexProblem>, 2> kRoutes{{
    {{.id = RouteId::point_index_cuda,
      .family = "point_index",
      .name = "cuda",
      .device = "cuda",
      .tier = GpuTier::classic,
      .rank = 0,
      .kernels = "cuda::point_index_cuda_batch_ids cuda::point_index_cuda_group",
      .files = {{{"src/backend/cuda/point_voxel/index.cpp",
          "CUDA (data on a cuda device, the CUDA backend built and a device present); batch ids "
          "int32 or int64 (P), checked to lie in [0, 2^31) (the smallest row outside is reported) "
          "and narrowed to int32; point grouping: a point -> voxel row map (P) int64 with rows in "
          "[0, M). Any P and M, including none. Deterministic: the CPU reference route's results, "
          "bit for bit (a stable radix sort of the points by voxel row)."}}}},
     admit_point_index_cuda},
    {{.id = RouteId::point_index_reference,
      .family = "point_index",
      .name = "reference",
      .device = "cpu",
      .tier = GpuTier::none,
      .rank = 9,
      .kernels = "cpu::point_index_reference_batch_ids cpu::point_index_reference_group",
      .files = {{{"src/backend/cpu/point_voxel/index.cpp",
          "CPU; batch ids int32 or int64 (P), checked to lie in [0, 2^31) (the first row outside is "
          "reported) and narrowed to int32; point grouping: a point -> voxel row map (P) int64 with "
          "rows in [0, M). Any P and M, including none. Deterministic (single-threaded, point "
          "order)."}}}},
     admit_point_index_reference},
}};

}  // namespace

void route_detail::point_index_route_infos(std::vector<RouteInfo>& out) { route_detail::append_infos(out, kRoutes); }

Explanation explain(const PointIndexProblem& problem, const DeviceCaps& caps, const RoutePolicy& policy) {
  return route_detail::run_table(kRoutes, problem, caps, policy);
}

std::optional<RouteId> select(const PointIndexProblem& problem, const DeviceCaps& caps, const RoutePolicy& policy) {
  return route_detail::decide_table(kRoutes, problem, caps, policy);
}

}  // namespace lattice
