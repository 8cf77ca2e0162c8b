// Constraints: CPU; points float32 or float64 (P, 3); optional int32 batch ids (P); any P.
// Single pass in point order, so voxel rows come out in first-occurrence order. Quantization
// is computed in float64: v = floor((p - origin) / voxel_size).
#include <cmath>
#include <vector>

#include "backend/common/coord_hash.h"
#include "backend/cpu/quantize/quantize_routes.h"

namespace lattice::backend::cpu {

namespace {

template <class T>
QuantizeResult run(const QuantizeArgs& a) {
  QuantizeResult r;
  const T* p = static_cast<const T*>(a.points);
  const std::int64_t n = a.n_points;
  std::vector<geometry::Coord4> voxels(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t v[3];
    for (int d = 0; d < 3; ++d) {
      const double x = static_cast<double>(p[i * 3 + d]);
      if (!std::isfinite(x)) {
        r.first_invalid = i;
        return r;
      }
      const double q = std::floor((x - a.origin[d]) / a.voxel_size[d]);
      if (!(q >= static_cast<double>(geometry::kInt32Min) && q <= static_cast<double>(geometry::kInt32Max))) {
        r.first_overflow = i;
        return r;
      }
      v[d] = static_cast<std::int64_t>(q);
    }
    voxels[static_cast<std::size_t>(i)] = {a.batch ? a.batch[i] : 0, static_cast<std::int32_t>(v[0]),
                                           static_cast<std::int32_t>(v[1]), static_cast<std::int32_t>(v[2])};
  }
  // Open addressing over voxel rows; slots hold the output row.
  std::uint64_t cap = 16;
  while (cap < static_cast<std::uint64_t>(2 * n)) cap <<= 1;
  std::vector<std::int32_t> slots(cap, -1);
  std::vector<geometry::Coord4> out;
  std::vector<std::int64_t> counts;
  r.inverse = Array::empty({n}, Dtype::i64);
  auto* inv = r.inverse.data<std::int64_t>();
  for (std::int64_t i = 0; i < n; ++i) {
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
