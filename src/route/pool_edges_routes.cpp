// The pool_edges route table: the edge lists pooling builds itself (global pooling: the rows of each batch; trilinear_upsample3d: the weighted neighbours). Each row's admit() matches the Constraints comment of its
// kernel file (src/backend/cpu/pool/edges.cpp, src/backend/cuda/pool/edges.cpp).
#include "route/route_table.h"

namespace lattice {

namespace {

using route_detail::RouteSpec;

// Every pass and row count, CPU data.
Verdict admit_pool_edges_reference(const PoolEdgesProblem& p, const DeviceCaps&) { return route_detail::needs_cpu(p.device); }

// Every pass and row count, data on a CUDA device of this build.
Verdict admit_pool_edges_cuda(const PoolEdgesProblem& p, const DeviceCaps& caps) { return route_detail::needs_cuda(p.device, caps); }

constexpr std::array<RouteSpec<PoolEdgesProblem>, 2> kRoutes{{
    {{.id = RouteId::pool_edges_cuda,
      .family = "pool_edges",
      .name = "cuda",
      .device = "cuda",
      .tier = GpuTier::classic,
      .rank = 0,
      .kernels = "cuda::pool_edges_cuda_batch cuda::pool_edges_cuda_trilinear",
      .files = {{{"src/backend/cuda/pool/edges.cpp",
          "CUDA (data on a cuda device, the CUDA backend built and a device present); int32 "
          "coordinate rows (N, 4) below 2^31 rows; global pooling: batch ids >= 0 (the smallest row "
          "with a negative one is reported) unless the batch count is given; trilinear_upsample3d: "
          "ratios >= 1, the coarse set's device table when cached. Any N, including none. "
          "Deterministic: the edge lists of the CPU reference route, bit for bit (stable radix sort "
          "by batch id; the trilinear rule in float64 without FMA)."}}}},
     admit_pool_edges_cuda},
    {{.id = RouteId::pool_edges_reference,
      .family = "pool_edges",
      .name = "reference",
      .device = "cpu",
      .tier = GpuTier::none,
      .rank = 9,
      .kernels = "cpu::pool_edges_reference_batch cpu::pool_edges_reference_trilinear",
      .files = {{{"src/backend/cpu/pool/edges.cpp",
          "CPU; int32 coordinate rows (N, 4) (the semantic layer has validated them); global "
          "pooling: batch ids >= 0 (the first negative one is reported, nothing else built) unless "
          "the batch count is given; trilinear_upsample3d: ratios >= 1, the coarse set's CPU index. "
          "Any N, including none. Deterministic (single-threaded, row order)."}}}},
     admit_pool_edges_reference},
}};

}  // namespace

void route_detail::pool_edges_route_infos(std::vector<RouteInfo>& out) { route_detail::append_infos(out, kRoutes); }

Explanation explain(const PoolEdgesProblem& problem, const DeviceCaps& caps, const RoutePolicy& policy) {
  return route_detail::run_table(kRoutes, problem, caps, policy);
}

std::optional<RouteId> select(const PoolEdgesProblem& problem, const DeviceCaps& caps, const RoutePolicy& policy) {
  return route_detail::decide_table(kRoutes, problem, caps, policy);
}

}  // namespace lattice
