// The relation route table: the coordinate index over a set's rows and the relations built from it
// (support, edges, orderings). Each row's admit() matches the Constraints comment of its kernel
// file (src/backend/cpu/relation/hash.cpp, src/backend/cuda/relation/hash.cu). Room for a
// sorted builder later: one more row here and its kernel file.
#include "route/route_table.h"

namespace lattice {

namespace {

using route_detail::RouteSpec;

// Every relation kind and kernel volume, CPU data.
Verdict admit_relation_cpu_hash(const RelationProblem& p, const DeviceCaps&) {
  return route_detail::needs_cpu(p.device);
}

// Every relation kind and kernel volume, data on a CUDA device of this build.
Verdict admit_relation_cuda_hash(const RelationProblem& p, const DeviceCaps& caps) {
  return route_detail::needs_cuda(p.device, caps);
}

constexpr std::array<RouteSpec<RelationProblem>, 2> kRelationRoutes{{
    {{.id = RouteId::relation_cuda_hash,
      .family = "relation",
      .name = "cuda_hash",
      .device = "cuda",
      .tier = GpuTier::classic,
      .rank = 0,
      .kernels = "cuda::device_build_table cuda::device_find_duplicate cuda::device_batch_histogram cuda::device_support cuda::device_edges cuda::device_count_edges cuda::device_row_ptr cuda::device_edge_list cuda::device_per_offset cuda::device_row_masks cuda::device_input_grouping cuda::device_input_map cuda::device_mirror_map cuda::device_row_order",
      .files = {{{"src/backend/cuda/relation/hash.cu",
          "CUDA (data on a cuda device, the CUDA backend built and a device present); "
          "contiguous (N, 4) int32 coordinate rows, any int32 values; every relation kind, any kernel "
          "volume, any row count (including none). Deterministic: the index, the supports, edges and "
          "orderings are bitwise equal to the cpu_hash route's, run to run (integer atomics only count "
          "or take minima)."}}}},
     admit_relation_cuda_hash},
    {{.id = RouteId::relation_cpu_hash,
      .family = "relation",
      .name = "cpu_hash",
      .device = "cpu",
      .tier = GpuTier::none,
      .rank = 1,
      .kernels = "cpu::relation_cpu_hash_build_table cpu::relation_cpu_hash_find_duplicate cpu::relation_cpu_hash_batch_histogram cpu::relation_cpu_hash_support cpu::relation_cpu_hash_edges cpu::relation_cpu_hash_count_edges cpu::relation_cpu_hash_row_ptr cpu::relation_cpu_hash_edge_list cpu::relation_cpu_hash_per_offset cpu::relation_cpu_hash_row_masks cpu::relation_cpu_hash_input_grouping cpu::relation_cpu_hash_input_map cpu::relation_cpu_hash_mirror_map cpu::relation_cpu_hash_row_order",
      .files = {{{"src/backend/cpu/relation/hash.cpp",
          "CPU; contiguous (N, 4) int32 coordinate rows, any int32 values, fewer than 2^31 "
          "rows (checked by the tensor layer); every relation kind, any kernel volume, any row count "
          "(including none). Deterministic: bitwise-identical results for any thread count (the index is "
          "built by sequential insertion in row order, supports in first-occurrence order)."}}}},
     admit_relation_cpu_hash},
}};

}  // namespace

void route_detail::relation_route_infos(std::vector<RouteInfo>& out) {
  route_detail::append_infos(out, kRelationRoutes);
}

Explanation explain(const RelationProblem& problem, const DeviceCaps& caps, const RoutePolicy& policy) {
  return route_detail::run_table(kRelationRoutes, problem, caps, policy);
}

std::optional<RouteId> select(const RelationProblem& problem, const DeviceCaps& caps, const RoutePolicy& policy) {
  return route_detail::decide_table(kRelationRoutes, problem, caps, policy);
}

}  // namespace lattice
