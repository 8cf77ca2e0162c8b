// Constraints: CPU; batch ids int32 or int64 (P), checked to lie in [0, 2^31) (the first row
// outside is reported) and narrowed to int32; point grouping: a point -> voxel row map (P) int64
// with rows in [0, M). Any P and M, including none. Deterministic (single-threaded, point order).
//
// Point grouping: the CSR of points per voxel by a stable counting sort, so the points of one
// voxel stay ascending (the order every point_voxel route sums in).
#include <vector>

#include "backend/kernels.h"

namespace lattice::backend::cpu {

BatchIdsResult point_index_reference_batch_ids(const BatchIdsArgs& a) {
  BatchIdsResult r;
  r.batch = Array::empty({a.n}, Dtype::i32);
  auto* dst = r.batch.data<std::int32_t>();
  for (std::int64_t i = 0; i < a.n; ++i) {
    const std::int64_t v = a.dtype == Dtype::i32 ? static_cast<const std::int32_t*>(a.ids)[i]
                                                 : static_cast<const std::int64_t*>(a.ids)[i];
    if (v < 0 || v > 2147483647) {
      r.batch = Array{};
      r.bad_row = i;
      r.bad_value = v;
      return r;
    }
    dst[i] = static_cast<std::int32_t>(v);
  }
  return r;
}

PointGroupResult point_index_reference_group(const PointGroupArgs& a) {
  const std::int64_t n = a.n_points, m = a.n_voxels;
  const std::int64_t* inv = a.inverse;
  PointGroupResult r;
  r.voxel_ptr = Array::zeros({m + 1}, Dtype::i64);
  auto* ptr = r.voxel_ptr.data<std::int64_t>();
  for (std::int64_t p = 0; p < n; ++p) ++ptr[inv[p] + 1];
  for (std::int64_t v = 0; v < m; ++v) ptr[v + 1] += ptr[v];
  r.point_idx = Array::empty({n}, Dtype::i64);
  auto* idx = r.point_idx.data<std::int64_t>();
  std::vector<std::int64_t> pos(ptr, ptr + m);
  for (std::int64_t p = 0; p < n; ++p) idx[pos[static_cast<std::size_t>(inv[p])]++] = p;
  return r;
}

}  // namespace lattice::backend::cpu

LATTICE_ROUTE_KERNELS(PointIndexKernels, point_index_reference, {
    .batch_ids = cpu::point_index_reference_batch_ids,
    .group = cpu::point_index_reference_group});
