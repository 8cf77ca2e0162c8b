// Constraints: CPU; any int32 coordinate rows (N, 4) (downsample, crop, dense) or (N, 3|4)
// (Morton, sparse_collate samples); strides >= 1; Morton values x, y, z within [-2^20, 2^20)
// (checked by the semantic layer); prune masks of N bytes; dense rows inside the grid and
// from_dense masks of B*X*Y*Z bytes (checked by the semantic layer); any N, including none.
// Deterministic (single-threaded, input order).
//
// downsample: c -> (batch, floor_div(x, sx), floor_div(y, sy), floor_div(z, sz)), unique rows in
// first-occurrence order and the input -> output row map (the forward-relation output rule of
// SEMANTICS.md "Relations").
// Morton: each axis is offset by 2^20 into [0, 2^21) and the three 21-bit values are interleaved
// into a 63-bit code, x in the most significant bit of each triple (bit 3i+2 = x_i,
// 3i+1 = y_i, 3i = z_i), so codes are non-negative int64 and distinct rows get distinct codes.
// The batch is not part of the code; the order sorts by (batch, code), stable.
// prune / crop: the kept row indices, ascending (mask != 0; lo <= (x, y, z) < hi on every axis).
// sparse_collate: the samples' rows concatenated with batch id i for sample i (its own batch
// column ignored), and the row counts. dense: flat cell
// ((b * X + x - ox) * Y + y - oy) * Z + z - oz.
// from_dense: the non-zero cells in (b, x, y, z) lexicographic order, coordinates cell + origin.
#include <algorithm>
#include <numeric>
#include <vector>

#include "backend/common/coord_hash.h"
#include "backend/kernels.h"

namespace lattice::backend::cpu {
namespace {

constexpr std::int64_t kMortonOffset = std::int64_t{1} << 20;

// The 21 low bits of v spread to every third bit (bit i -> bit 3i).
std::uint64_t spread3(std::uint64_t v) {
  std::uint64_t r = 0;
  for (int i = 0; i < 21; ++i) r |= ((v >> i) & 1u) << (3 * i);
  return r;
}

}  // namespace

DownsampleResult coords_reference_downsample(const DownsampleArgs& a) {
  DownsampleResult out;
  out.inverse = Array::empty({a.n}, Dtype::i64);
  auto* inv = out.inverse.data<std::int64_t>();
  std::uint64_t cap = 16;
  while (cap < static_cast<std::uint64_t>(2 * a.n)) cap <<= 1;
  std::vector<std::int64_t> slots(cap, -1);
  std::vector<geometry::Coord4> rows;
  for (std::int64_t i = 0; i < a.n; ++i) {
    const std::int32_t* c = a.coords + 4 * i;
    const geometry::Coord4 d{c[0],
                             static_cast<std::int32_t>(geometry::floor_div(c[1], a.stride[0])),
                             static_cast<std::int32_t>(geometry::floor_div(c[2], a.stride[1])),
                             static_cast<std::int32_t>(geometry::floor_div(c[3], a.stride[2]))};
    std::uint64_t h = geometry::hash_coord(d) & (cap - 1);
    while (true) {
      const std::int64_t s = slots[h];
      if (s < 0) {
        slots[h] = static_cast<std::int64_t>(rows.size());
        inv[i] = slots[h];
        rows.push_back(d);
        break;
      }
      if (rows[static_cast<std::size_t>(s)] == d) {
        inv[i] = s;
        break;
      }
      h = (h + 1) & (cap - 1);
    }
  }
  const auto m = static_cast<std::int64_t>(rows.size());
  out.coords = Array::empty({m, 4}, Dtype::i32);
  auto* dst = out.coords.data<std::int32_t>();
  for (std::int64_t k = 0; k < m; ++k) {
    const geometry::Coord4& r = rows[static_cast<std::size_t>(k)];
    dst[4 * k + 0] = r.b;
    dst[4 * k + 1] = r.x;
    dst[4 * k + 2] = r.y;
    dst[4 * k + 3] = r.z;
  }
  return out;
}

void coords_reference_morton(const MortonArgs& a) {
  const std::int64_t first = a.cols == 4 ? 1 : 0;
  std::vector<std::int64_t> codes(static_cast<std::size_t>(a.n));
  for (std::int64_t i = 0; i < a.n; ++i) {
    const std::int32_t* c = a.coords + a.cols * i + first;
    const auto u = [&](int axis) { return static_cast<std::uint64_t>(c[axis] + kMortonOffset); };
    codes[i] =
        static_cast<std::int64_t>((spread3(u(0)) << 2) | (spread3(u(1)) << 1) | spread3(u(2)));
  }
  if (a.codes) std::copy(codes.begin(), codes.end(), a.codes);
  if (a.order) {
    std::vector<std::int64_t> order(static_cast<std::size_t>(a.n));
    std::iota(order.begin(), order.end(), std::int64_t{0});
    const auto batch = [&](std::int64_t i) { return a.cols == 4 ? a.coords[a.cols * i] : 0; };
    std::stable_sort(order.begin(), order.end(), [&](std::int64_t p, std::int64_t q) {
      const std::int32_t bp = batch(p), bq = batch(q);
      return bp != bq ? bp < bq : codes[p] < codes[q];
    });
    std::copy(order.begin(), order.end(), a.order);
  }
}

Array coords_reference_select(const SelectArgs& a) {
  std::vector<std::int64_t> kept;
  kept.reserve(static_cast<std::size_t>(a.n));
  for (std::int64_t i = 0; i < a.n; ++i) {
    bool keep = true;
    if (a.mask) keep = a.mask[i] != 0;
    if (keep && a.coords) {
      const std::int32_t* c = a.coords + 4 * i + 1;
      for (int axis = 0; axis < 3; ++axis)
        keep = keep && c[axis] >= a.lo[axis] && c[axis] < a.hi[axis];
    }
    if (keep) kept.push_back(i);
  }
  Array out = Array::empty({static_cast<std::int64_t>(kept.size())}, Dtype::i64);
  std::copy(kept.begin(), kept.end(), out.data<std::int64_t>());
  return out;
}

CollateResult coords_reference_collate(const std::vector<CollateSample>& samples) {
  CollateResult out;
  std::int64_t total = 0;
  for (const CollateSample& s : samples) {
    out.counts.push_back(s.n);
    total += s.n;
  }
  out.coords = Array::empty({total, 4}, Dtype::i32);
  auto* dst = out.coords.data<std::int32_t>();
  std::int64_t row = 0;
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const CollateSample& s = samples[i];
    for (std::int64_t r = 0; r < s.n; ++r, ++row) {
      const std::int32_t* c = s.coords + s.cols * r + (s.cols - 3);
      dst[4 * row + 0] = static_cast<std::int32_t>(i);
      dst[4 * row + 1] = c[0];
      dst[4 * row + 2] = c[1];
      dst[4 * row + 3] = c[2];
    }
  }
  return out;
}

void coords_reference_dense_index(const DenseIndexArgs& a) {
  for (std::int64_t i = 0; i < a.n; ++i) {
    const std::int32_t* c = a.coords + 4 * i;
    std::int64_t flat = c[0];
    for (int axis = 0; axis < 3; ++axis)
      flat = flat * a.size[axis] + (std::int64_t{c[axis + 1]} - a.origin[axis]);
    a.index[i] = flat;
  }
}

NonzeroResult coords_reference_nonzero(const NonzeroArgs& a) {
  NonzeroResult out;
  const std::int64_t cells = a.size[0] * a.size[1] * a.size[2];
  std::vector<std::int64_t> flat;
  out.counts.assign(static_cast<std::size_t>(a.batch), 0);
  for (std::int64_t f = 0; f < a.batch * cells; ++f) {
    if (a.site[f] == 0) continue;
    flat.push_back(f);
    ++out.counts[static_cast<std::size_t>(f / cells)];
  }
  const auto k = static_cast<std::int64_t>(flat.size());
  out.coords = Array::empty({k, 4}, Dtype::i32);
  out.index = Array::empty({k}, Dtype::i64);
  auto* dst = out.coords.data<std::int32_t>();
  auto* idx = out.index.data<std::int64_t>();
  for (std::int64_t r = 0; r < k; ++r) {
    std::int64_t f = flat[static_cast<std::size_t>(r)];
    idx[r] = f;
    const std::int64_t z = f % a.size[2];
    f /= a.size[2];
    const std::int64_t y = f % a.size[1];
    f /= a.size[1];
    const std::int64_t x = f % a.size[0];
    dst[4 * r + 0] = static_cast<std::int32_t>(f / a.size[0]);
    dst[4 * r + 1] = static_cast<std::int32_t>(x + a.origin[0]);
    dst[4 * r + 2] = static_cast<std::int32_t>(y + a.origin[1]);
    dst[4 * r + 3] = static_cast<std::int32_t>(z + a.origin[2]);
  }
  return out;
}

}  // namespace lattice::backend::cpu

LATTICE_ROUTE_KERNELS(CoordsKernels, coords_reference, {
    .downsample = cpu::coords_reference_downsample,
    .morton = cpu::coords_reference_morton,
    .select = cpu::coords_reference_select,
    .collate = cpu::coords_reference_collate,
    .dense_index = cpu::coords_reference_dense_index,
    .nonzero = cpu::coords_reference_nonzero});
