// Helpers shared by the CPU point <-> voxel routes: the per-point map rule (one function, so the
// routes agree bit for bit; the numpy oracle is the independent check of the rule itself) and
// the voxel-major CSR of a map.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/args.h"
#include "backend/common/point_voxel.h"

namespace lattice::backend::cpu::point_voxel {

constexpr int kWidth = geometry::kTrilinearCorners;  // columns of a map's indices / weights

// First point with a NaN/inf coordinate, or -1.
template <class P>
std::int64_t first_non_finite(const P* points, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i)
    for (int d = 0; d < 3; ++d)
      if (!std::isfinite(static_cast<double>(points[i * 3 + d]))) return i;
  return -1;
}

// Map row of point i: idx[k] = voxel row or -1, w[k] = weight (0 where idx < 0).
template <class P>
void map_point(const PointVoxelMapArgs& a, std::int64_t i, std::int64_t idx[kWidth],
               double w[kWidth]) {
  const P* p = static_cast<const P*>(a.points) + i * 3;
  const std::int32_t b = a.batch ? a.batch[i] : 0;
  for (int k = 0; k < kWidth; ++k) {
    idx[k] = -1;
    w[k] = 0.0;
  }
  if (a.mode == PointVoxelMode::nearest) {
    std::int32_t v[3];
    for (int d = 0; d < 3; ++d) {
      const double q =
          geometry::voxel_floor(static_cast<double>(p[d]), a.origin[d], a.voxel_size[d]);
      if (!geometry::voxel_index_fits(q)) return;  // no voxel of int32 coordinates holds it
      v[d] =
          static_cast<std::int32_t>(geometry::floor_div(static_cast<std::int64_t>(q), a.stride[d]));
    }
    idx[0] = a.lookup.find(a.lookup.context, b, v[0], v[1], v[2]);
    w[0] = idx[0] >= 0 ? 1.0 : 0.0;
    return;
  }
  geometry::TrilinearAxis ax[3];
  for (int d = 0; d < 3; ++d)
    ax[d] = geometry::trilinear_axis(static_cast<double>(p[d]), a.origin[d],
                                     a.voxel_size[d] * a.stride[d]);
  double sum = 0.0;
  for (int k = 0; k < kWidth; ++k) {
    double c[3];
    double raw = 1.0;
    bool fits = true;
    for (int d = 0; d < 3; ++d) {
      const int o = geometry::corner_offset(k, d);
      c[d] = ax[d].lower + o;
      fits = fits && geometry::voxel_index_fits(c[d]);
      raw *= o ? ax[d].t : 1.0 - ax[d].t;
    }
    if (!fits) continue;
    const std::int64_t r =
        a.lookup.find(a.lookup.context, b, static_cast<std::int32_t>(c[0]),
                      static_cast<std::int32_t>(c[1]), static_cast<std::int32_t>(c[2]));
    if (r < 0) continue;
    idx[k] = r;
    w[k] = raw;
    sum += raw;
  }
  if (a.normalize) {
    for (int k = 0; k < kWidth; ++k) w[k] = sum > 0.0 ? w[k] / sum : 0.0;
  }
}

// Voxel-major CSR over the map entries e = p*width + k with indices[e] >= 0: the entries of
// voxel v are entries[ptr[v] .. ptr[v+1]), ascending. Serial counting sort (O(P*width)).
inline void build_voxel_major_csr(PointVoxelMapResult& r, std::int64_t n_points,
                                  std::int64_t n_voxels) {
  const std::int64_t* idx = r.indices.data<std::int64_t>();
  r.voxel_ptr = Array::zeros({n_voxels + 1}, Dtype::i64);
  std::int64_t* ptr = r.voxel_ptr.data<std::int64_t>();
  const std::int64_t slots = n_points * kWidth;
  for (std::int64_t e = 0; e < slots; ++e)
    if (idx[e] >= 0) ++ptr[idx[e] + 1];
  for (std::int64_t v = 0; v < n_voxels; ++v) ptr[v + 1] += ptr[v];
  r.entries = Array::empty({ptr[n_voxels]}, Dtype::i64);
  std::int64_t* ent = r.entries.data<std::int64_t>();
  std::vector<std::int64_t> pos(ptr, ptr + n_voxels);
  for (std::int64_t e = 0; e < slots; ++e)
    if (idx[e] >= 0) ent[pos[static_cast<std::size_t>(idx[e])]++] = e;
}

}  // namespace lattice::backend::cpu::point_voxel
