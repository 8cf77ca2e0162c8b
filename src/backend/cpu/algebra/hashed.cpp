// Constraints: CPU; align and lookup on any int32 coordinate rows (unique within each set), given
// the coordinate index of every set it probes (AlignArgs::lhs_index / rhs_index,
// LookupArgs::index); combine passes on float dtypes (f16, bf16, f32, f64); any row count,
// including none. Deterministic: bitwise-identical results for any thread count.
//
// Alignment probes the index the tensor layer already built for each set (CoordIndex: open
// addressing over full 128-bit rows, so probes never alias) from lattice's OpenMP threads, one
// probe per row. Joins that drop rows (inner, and the rhs-only tail of outer) are compacted by
// fixed blocks of kBlockRows: count per block, exclusive prefix sum, write per block; the block
// size does not depend on the thread count, so output order is always the input order. The
// combine passes split the output rows evenly over threads; in the backward pass each input row
// occurs at most once in an alignment, so gradient rows are written without races or atomics.
//
// Shapes: lhs (n_lhs, 4), rhs (n_rhs, 4), queries (Q, 4) int32; row maps (M) int64; features
// lhs (n_lhs, C_lhs), rhs (n_rhs, C_rhs), out / dout (M, C_out) of the storage dtype T.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cpu/algebra/combine.h"
#include "backend/kernels.h"
#include "lattice/core/error.h"
#include "lattice/core/threads.h"

namespace lattice::backend::cpu {
namespace {

// Below this many probed rows (or combined elements) a loop runs on one thread: an OpenMP
// fork/join costs a few microseconds, about as much as 2^12 hash probes. Estimates, not
// benchmarked yet (2026-11).
constexpr std::int64_t kParallelMinRows = std::int64_t{1} << 12;
constexpr std::int64_t kParallelMinElements = std::int64_t{1} << 16;
// Rows per compaction block (fixed: the output order must not depend on the thread count).
constexpr std::int64_t kBlockRows = 4096;

int threads_for(std::int64_t work, std::int64_t minimum) {
  return work < minimum ? 1 : lattice::num_threads();
}

const geometry::Coord4* as_rows(const std::int32_t* coords) {
  return reinterpret_cast<const geometry::Coord4*>(coords);
}

// found[i] = index(rows[i]) for i < n.
void probe(const CoordFinder& index, const std::int32_t* coords, std::int64_t n,
           std::int64_t* found) {
  LATTICE_ASSERT(n == 0 || index.find, "algebra hashed: a coordinate index is required");
  const geometry::Coord4* rows = as_rows(coords);
#pragma omp parallel for schedule(static) num_threads(threads_for(n, kParallelMinRows))
  for (std::int64_t i = 0; i < n; ++i) found[i] = index(rows[i]);
}

// The i < n with keep(i), in increasing order. Two passes over fixed blocks.
template <class Keep>
std::vector<std::int64_t> compact(std::int64_t n, Keep keep) {
  const std::int64_t blocks = (n + kBlockRows - 1) / kBlockRows;
  std::vector<std::int64_t> offset(static_cast<std::size_t>(blocks) + 1, 0);
  const int threads = threads_for(n, kParallelMinRows);
#pragma omp parallel for schedule(static) num_threads(threads)
  for (std::int64_t b = 0; b < blocks; ++b) {
    std::int64_t count = 0;
    const std::int64_t end = std::min(n, (b + 1) * kBlockRows);
    for (std::int64_t i = b * kBlockRows; i < end; ++i) count += keep(i) ? 1 : 0;
    offset[b + 1] = count;
  }
  for (std::int64_t b = 0; b < blocks; ++b) offset[b + 1] += offset[b];
  std::vector<std::int64_t> kept(static_cast<std::size_t>(offset[blocks]));
#pragma omp parallel for schedule(static) num_threads(threads)
  for (std::int64_t b = 0; b < blocks; ++b) {
    std::int64_t w = offset[b];
    const std::int64_t end = std::min(n, (b + 1) * kBlockRows);
    for (std::int64_t i = b * kBlockRows; i < end; ++i)
      if (keep(i)) kept[w++] = i;
  }
  return kept;
}

void gather_coords(const AlignArgs& a, AlignResult& out) {
  const std::int64_t m = out.lhs_rows.dim(0);
  out.coords = Array::empty({m, 4}, Dtype::i32);
  const auto* l = out.lhs_rows.data<std::int64_t>();
  const auto* r = out.rhs_rows.data<std::int64_t>();
  auto* c = out.coords.data<std::int32_t>();
#pragma omp parallel for schedule(static) num_threads(threads_for(m, kParallelMinRows))
  for (std::int64_t k = 0; k < m; ++k) {
    const std::int32_t* src = l[k] >= 0 ? a.lhs + 4 * l[k] : a.rhs + 4 * r[k];
    std::memcpy(c + 4 * k, src, 4 * sizeof(std::int32_t));
  }
}

// rows[k] = k for k < n.
void iota(std::int64_t* rows, std::int64_t n) {
#pragma omp parallel for schedule(static) num_threads(threads_for(n, kParallelMinRows))
  for (std::int64_t k = 0; k < n; ++k) rows[k] = k;
}

}  // namespace

AlignResult algebra_hashed_align(const AlignArgs& a) {
  AlignResult out;
  switch (a.join) {
    case Join::left: {
      out.lhs_rows = Array::empty({a.n_lhs}, Dtype::i64);
      out.rhs_rows = Array::empty({a.n_lhs}, Dtype::i64);
      iota(out.lhs_rows.data<std::int64_t>(), a.n_lhs);
      probe(a.rhs_index, a.lhs, a.n_lhs, out.rhs_rows.data<std::int64_t>());
      break;
    }
    case Join::right: {
      out.lhs_rows = Array::empty({a.n_rhs}, Dtype::i64);
      out.rhs_rows = Array::empty({a.n_rhs}, Dtype::i64);
      probe(a.lhs_index, a.rhs, a.n_rhs, out.lhs_rows.data<std::int64_t>());
      iota(out.rhs_rows.data<std::int64_t>(), a.n_rhs);
      break;
    }
    case Join::inner: {
      std::vector<std::int64_t> found(static_cast<std::size_t>(a.n_lhs));
      probe(a.rhs_index, a.lhs, a.n_lhs, found.data());
      const std::vector<std::int64_t> kept =
          compact(a.n_lhs, [&](std::int64_t i) { return found[i] >= 0; });
      const auto m = static_cast<std::int64_t>(kept.size());
      out.lhs_rows = Array::from_vector(kept, {m});
      out.rhs_rows = Array::empty({m}, Dtype::i64);
      auto* r = out.rhs_rows.data<std::int64_t>();
#pragma omp parallel for schedule(static) num_threads(threads_for(m, kParallelMinRows))
      for (std::int64_t k = 0; k < m; ++k) r[k] = found[kept[k]];
      break;
    }
    case Join::outer: {
      std::vector<std::int64_t> in_lhs(static_cast<std::size_t>(a.n_rhs));
      probe(a.lhs_index, a.rhs, a.n_rhs, in_lhs.data());
      const std::vector<std::int64_t> rhs_only =
          compact(a.n_rhs, [&](std::int64_t j) { return in_lhs[j] < 0; });
      const std::int64_t tail = static_cast<std::int64_t>(rhs_only.size());
      const std::int64_t m = a.n_lhs + tail;
      out.lhs_rows = Array::empty({m}, Dtype::i64);
      out.rhs_rows = Array::empty({m}, Dtype::i64);
      auto* l = out.lhs_rows.data<std::int64_t>();
      auto* r = out.rhs_rows.data<std::int64_t>();
      iota(l, a.n_lhs);
      probe(a.rhs_index, a.lhs, a.n_lhs, r);
#pragma omp parallel for schedule(static) num_threads(threads_for(tail, kParallelMinRows))
      for (std::int64_t k = 0; k < tail; ++k) {
        l[a.n_lhs + k] = -1;
        r[a.n_lhs + k] = rhs_only[k];
      }
      break;
    }
  }
  gather_coords(a, out);
  return out;
}

void algebra_hashed_lookup(const LookupArgs& a) { probe(a.index, a.queries, a.n_queries, a.rows); }

void algebra_hashed_forward(const CombineArgs& a) {
  dispatch_float(a.dtype, "algebra", "feats", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const std::int64_t work = a.n_out * (a.c_lhs + a.c_rhs);
    const int threads = threads_for(work, kParallelMinElements);
#pragma omp parallel num_threads(threads)
    {
      const std::int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
      const std::int64_t m0 = a.n_out * t / nt, m1 = a.n_out * (t + 1) / nt;
      algebra_detail::forward_rows<T>(a, m0, m1);
    }
  });
}

void algebra_hashed_backward(const CombineArgs& a) {
  dispatch_float(a.dtype, "algebra", "feats", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const std::int64_t work = a.n_out * (a.c_lhs + a.c_rhs);
    const int threads = threads_for(work, kParallelMinElements);
    T* dl = static_cast<T*>(a.dlhs);
    T* dr = static_cast<T*>(a.drhs);
    const std::int64_t nl = dl ? a.n_lhs * a.c_lhs : 0, nr = dr ? a.n_rhs * a.c_rhs : 0;
#pragma omp parallel num_threads(threads)
    {
      const std::int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
      // Zero this thread's share of both gradients, then (after the barrier) write the rows
      // that occur in the output.
      if (nl)
        std::memset(static_cast<void*>(dl + nl * t / nt), 0,
                    sizeof(T) * (nl * (t + 1) / nt - nl * t / nt));
      if (nr)
        std::memset(static_cast<void*>(dr + nr * t / nt), 0,
                    sizeof(T) * (nr * (t + 1) / nt - nr * t / nt));
#pragma omp barrier
      const std::int64_t m0 = a.n_out * t / nt, m1 = a.n_out * (t + 1) / nt;
      algebra_detail::backward_rows<T>(a, m0, m1);
    }
  });
}

}  // namespace lattice::backend::cpu

LATTICE_ROUTE_KERNELS(AlgebraKernels, algebra_hashed, {
    .align = cpu::algebra_hashed_align,
    .lookup = cpu::algebra_hashed_lookup,
    .forward = cpu::algebra_hashed_forward,
    .backward = cpu::algebra_hashed_backward});
