// Constraints: CPU; points float32 or float64 (P, 3); optional int32 batch ids (P); any P.
// Single pass in point order, so voxel rows come out in first-occurrence order. Quantization
// is computed in float64: v = floor((p - origin) / voxel_size) (backend/common/point_voxel.h).
// With drop_invalid, points with a NaN/inf coordinate are skipped (kept[i] = false) and the
// inverse lists the kept points only; otherwise the first such point is reported.
#include <cmath>
#include <vector>

#include "backend/common/coord_hash.h"
#include "backend/common/point_voxel.h"
#include "backend/kernels.h"

namespace lattice::backend::cpu {

namespace {

template <class T>
QuantizeResult run(const QuantizeArgs& a) {
  QuantizeResult r;
  const T* p = static_cast<const T*>(a.points);
  const std::int64_t n = a.n_points;
  std::vector<geometry::Coord4> voxels;
  voxels.reserve(static_cast<std::size_t>(n));
  bool* kept = nullptr;
  if (a.drop_invalid) {
    r.kept = Array::empty({n}, Dtype::boolean);
    kept = r.kept.data<bool>();
  }
  for (std::int64_t i = 0; i < n; ++i) {
    bool finite = true;
    for (int d = 0; d < 3; ++d) finite = finite && std::isfinite(static_cast<double>(p[i * 3 + d]));
    if (kept) kept[i] = finite;
    if (!finite) {
      if (a.drop_invalid) continue;
      r.first_invalid = i;
      return r;
    }
    std::int64_t v[3];
    for (int d = 0; d < 3; ++d) {
      const double q =
          geometry::voxel_floor(static_cast<double>(p[i * 3 + d]), a.origin[d], a.voxel_size[d]);
      if (!geometry::voxel_index_fits(q)) {
        r.first_overflow = i;
        return r;
      }
      v[d] = static_cast<std::int64_t>(q);
    }
    voxels.push_back({a.batch ? a.batch[i] : 0, static_cast<std::int32_t>(v[0]),
                      static_cast<std::int32_t>(v[1]), static_cast<std::int32_t>(v[2])});
  }
  const auto n_kept = static_cast<std::int64_t>(voxels.size());
  // Open addressing over voxel rows; slots hold the output row.
  std::uint64_t cap = 16;
  while (cap < static_cast<std::uint64_t>(2 * n_kept)) cap <<= 1;
  std::vector<std::int32_t> slots(cap, -1);
  std::vector<geometry::Coord4> out;
  std::vector<std::int64_t> counts;
  r.inverse = Array::empty({n_kept}, Dtype::i64);
  auto* inv = r.inverse.data<std::int64_t>();
  for (std::int64_t i = 0; i < n_kept; ++i) {
    const auto& c = voxels[static_cast<std::size_t>(i)];
    std::uint64_t h = geometry::hash_coord(c) & (cap - 1);
    while (true) {
      const std::int32_t s = slots[h];
      if (s < 0) {
        slots[h] = static_cast<std::int32_t>(out.size());
        inv[i] = static_cast<std::int64_t>(out.size());
        out.push_back(c);
        counts.push_back(1);
        break;
      }
      if (out[static_cast<std::size_t>(s)] == c) {
        inv[i] = s;
        ++counts[static_cast<std::size_t>(s)];
        break;
      }
      h = (h + 1) & (cap - 1);
    }
  }
  const auto m = static_cast<std::int64_t>(out.size());
  r.coords = Array::empty({m, 4}, Dtype::i32);
  auto* c = r.coords.data<std::int32_t>();
  for (std::int64_t j = 0; j < m; ++j) {
    const auto& o = out[static_cast<std::size_t>(j)];
    c[j * 4 + 0] = o.b;
    c[j * 4 + 1] = o.x;
    c[j * 4 + 2] = o.y;
    c[j * 4 + 3] = o.z;
  }
  r.counts = Array::from_vector(counts);
  return r;
}

}  // namespace

QuantizeResult quantize_reference(const QuantizeArgs& args) {
  if (args.dtype == Dtype::f64) return run<double>(args);
  return run<float>(args);
}

}  // namespace lattice::backend::cpu

LATTICE_ROUTE_KERNELS(QuantizeKernels, quantize_reference, {.quantize = cpu::quantize_reference});
