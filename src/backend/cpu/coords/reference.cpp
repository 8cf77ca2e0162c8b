// Constraints: CPU; any int32 coordinate rows (N, 4) (downsample) or (N, 3|4) (Morton); strides
// >= 1; Morton values x, y, z within [-2^20, 2^20) (checked by the semantic layer); any N,
// including none. Deterministic (single-threaded, input order).
//
// downsample: c -> (batch, floor_div(x, sx), floor_div(y, sy), floor_div(z, sz)), unique rows in
// first-occurrence order and the input -> output row map (the forward-relation output rule of
// SEMANTICS.md "Relations").
// Morton: each axis is offset by 2^20 into [0, 2^21) and the three 21-bit values are interleaved
// into a 63-bit code, x in the most significant bit of each triple (bit 3i+2 = x_i,
// 3i+1 = y_i, 3i = z_i), so codes are non-negative int64 and distinct rows get distinct codes.
// The batch is not part of the code; the order sorts by (batch, code), stable.
#include <algorithm>
#include <numeric>
#include <vector>

#include "backend/common/coord_hash.h"
#include "backend/cpu/coords/coords_routes.h"

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

}  // namespace lattice::backend::cpu
