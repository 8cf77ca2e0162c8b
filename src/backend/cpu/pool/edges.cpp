// Constraints: CPU; int32 coordinate rows (N, 4) (the semantic layer has validated them);
// global pooling: batch ids >= 0 (the first negative one is reported, nothing else built) unless
// the batch count is given; trilinear_upsample3d: ratios >= 1, the coarse set's CPU index. Any
// N, including none. Deterministic (single-threaded, row order).
//
// Global pooling: the rows of each batch by a stable counting sort on the batch id (each batch's
// rows ascending), and the first batch without rows. Trilinear upsampling: per fine row f and
// axis, u = (2f + 1 - r) / (2r) coarse units, lo = floor(u); integer weights (2r - m) for lo and
// m for lo + 1 over the common denominator 2r, which cancels in the normalisation; the 8 corners
// in (x, y, z) bit order, the coarse rows found through the index, weights normalised in float64.
#include <algorithm>
#include <vector>

#include "backend/common/coord_hash.h"
#include "backend/common/geometry.h"
#include "backend/kernels.h"
#include "lattice/core/error.h"

namespace lattice::backend::cpu {

PoolEdgeList pool_edges_reference_batch(const BatchEdgesArgs& a) {
  PoolEdgeList out;
  const std::int64_t n = a.n;
  const std::int32_t* rows = a.coords;
  std::int64_t batches = a.batches;
  if (batches < 0) {
    batches = 0;
    for (std::int64_t r = 0; r < n; ++r) {
      const std::int32_t b = rows[4 * r];
      if (b < 0) {
        out.negative_row = r;
        out.negative_batch = b;
        return out;
      }
      batches = std::max<std::int64_t>(batches, std::int64_t{b} + 1);
    }
  }
  std::vector<std::int64_t> out_ptr(static_cast<std::size_t>(batches + 1), 0);
  for (std::int64_t r = 0; r < n; ++r) ++out_ptr[static_cast<std::size_t>(rows[4 * r]) + 1];
  for (std::int64_t b = 0; b < batches; ++b) {
    if (out_ptr[b + 1] == 0) {
      out.first_empty = b;
      break;
    }
  }
  for (std::int64_t b = 0; b < batches; ++b) out_ptr[b + 1] += out_ptr[b];
  std::vector<std::int32_t> in_idx(static_cast<std::size_t>(n));
  std::vector<std::int64_t> cursor(out_ptr.begin(), out_ptr.end() - 1);
  for (std::int64_t r = 0; r < n; ++r) in_idx[cursor[rows[4 * r]]++] = static_cast<std::int32_t>(r);
  out.out_ptr = Array::from_vector(out_ptr);
  out.in_idx = Array::from_vector(in_idx);
  return out;
}

PoolEdgeList pool_edges_reference_trilinear(const TrilinearEdgesArgs& a) {
  LATTICE_ASSERT(a.coarse_slots != nullptr, "pool_edges_reference_trilinear needs the coarse set's index");
  const auto* slots = reinterpret_cast<const geometry::HostCoordSlot*>(a.coarse_slots);
  const std::int64_t n_fine = a.n_fine;
  const std::int32_t* rows = a.fine;
  std::vector<std::int64_t> out_ptr(static_cast<std::size_t>(n_fine + 1), 0);
  std::vector<std::int32_t> in_idx;
  std::vector<double> weights;
  in_idx.reserve(static_cast<std::size_t>(n_fine) * 8);
  weights.reserve(static_cast<std::size_t>(n_fine) * 8);
  for (std::int64_t o = 0; o < n_fine; ++o) {
    std::int64_t lo[3], w[3][2];
    for (int ax = 0; ax < 3; ++ax) {
      const std::int64_t r = a.ratio[ax], num = 2 * std::int64_t{rows[4 * o + 1 + ax]} + 1 - r, den = 2 * r;
      lo[ax] = geometry::floor_div(num, den);
      const std::int64_t m = num - lo[ax] * den;
      w[ax][0] = den - m;
      w[ax][1] = m;
    }
    const std::size_t first = in_idx.size();
    double total = 0;
    for (int corner = 0; corner < 8; ++corner) {
      const int d[3] = {(corner >> 2) & 1, (corner >> 1) & 1, corner & 1};
      const double wc = static_cast<double>(w[0][d[0]]) * static_cast<double>(w[1][d[1]]) *
                        static_cast<double>(w[2][d[2]]);
      if (wc == 0) continue;
      std::int64_t c[3];
      bool fits = true;
      for (int ax = 0; ax < 3; ++ax) {
        c[ax] = lo[ax] + d[ax];
        fits = fits && geometry::fits_int32(c[ax]);
      }
      if (!fits) continue;
      const std::int64_t i = geometry::host_find(
          slots, a.coarse_mask,
          geometry::Coord4{rows[4 * o], static_cast<std::int32_t>(c[0]), static_cast<std::int32_t>(c[1]),
                           static_cast<std::int32_t>(c[2])});
      if (i < 0) continue;
      in_idx.push_back(static_cast<std::int32_t>(i));
      weights.push_back(wc);
      total += wc;
    }
    for (std::size_t e = first; e < weights.size(); ++e) weights[e] /= total;
    out_ptr[o + 1] = static_cast<std::int64_t>(in_idx.size());
  }
  PoolEdgeList out;
  out.out_ptr = Array::from_vector(out_ptr);
  out.in_idx = Array::from_vector(in_idx);
  out.weights = Array::from_vector(weights);
  return out;
}

}  // namespace lattice::backend::cpu

LATTICE_ROUTE_KERNELS(PoolEdgeKernels, pool_edges_reference, {
    .batch_edges = cpu::pool_edges_reference_batch,
    .trilinear_edges = cpu::pool_edges_reference_trilinear});
