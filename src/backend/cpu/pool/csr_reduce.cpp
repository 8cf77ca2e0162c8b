// Constraints: CPU; any float dtype (f16, bf16, f32, f64); any pool mode (sum, avg, max,
// weighted), any edge list (including none), forward and input_grad. Deterministic:
// bitwise-identical results for any thread count, and equal to the reference route.
//
// Forward: one work item per output row over the output-major CSR (out_ptr, in_idx); OpenMP
// over rows. Input gradient: a stable counting sort of the edge list by input row (O(E + N_in)
// integer work, single-threaded) gives each input row its edges with the output row ascending;
// then one work item per input row, OpenMP over rows. Every output element is produced by one
// thread in a fixed order (pool_routes.h), so there are no atomics and no races.
//
// Shapes (named axes; C = channels, E = edges): x (n_in, C), y (n_out, C), argmax (n_out, C)
// int32, dy (n_out, C), dx (n_in, C), weights (E) float64. Buffers: per thread one (C)
// accumulator row; for the input gradient the input-major copy of the edges, int64 (N_in + 1)
// + int32 (E) (+ int64 (E) edge ids for mode weighted).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/cpu/pool/pool_routes.h"
#include "backend/kernels.h"
#include "lattice/core/error.h"
#include "lattice/core/threads.h"

namespace lattice::backend::cpu {
namespace {

// Below this many touched elements (edges x channels) one thread does the work. A pooling
// element is a load and an add (memory-bound, ~1 ns); an OpenMP fork/join with its barrier costs
// microseconds on an idle machine and whole scheduler slices (4-8 ms) on a loaded one
// (docs/performance.md), so only work worth a quarter millisecond or more is split.
// Estimate from the smoke benchmark on the 2-core dev machine (2026-11).
constexpr std::int64_t kParallelMinWork = std::int64_t{1} << 18;
// Rows per dynamic-schedule chunk: rows differ in edge counts, chunks balance them.
constexpr int kRowChunk = 64;

int threads_for(std::int64_t work) { return work < kParallelMinWork ? 1 : num_threads(); }

template <class T>
void forward(const PoolArgs& a) {
  using A = Accum<T>;
  const auto* x = static_cast<const T*>(a.x);
  auto* y = static_cast<T*>(a.y);
  const std::int64_t C = a.channels;
  const int threads = threads_for(std::max(a.n_edges, a.n_out) * C);
#pragma omp parallel num_threads(threads)
  {
    std::vector<A> acc(static_cast<std::size_t>(C));
    std::vector<std::int32_t> best_i(static_cast<std::size_t>(C));
#pragma omp for schedule(dynamic, kRowChunk)
    for (std::int64_t o = 0; o < a.n_out; ++o) {
      const std::int64_t begin = a.out_ptr[o], end = a.out_ptr[o + 1];
      T* yo = y + o * C;
      if (a.mode == PoolMode::max) {
        // Channel-inner loop over the edges (each edge's row is read once, contiguously).
        std::fill(best_i.begin(), best_i.end(), -1);
        for (std::int64_t e = begin; e < end; ++e) {
          const std::int32_t i = a.in_idx[e];
          const T* xi = x + std::int64_t{i} * C;
          for (std::int64_t c = 0; c < C; ++c) {
            const A v = load(xi[c]);
            if (best_i[c] < 0 || pool_detail::max_beats(v, i, acc[c], best_i[c])) {
              acc[c] = v;
              best_i[c] = i;
            }
          }
        }
        std::int32_t* am = a.argmax + o * C;
        for (std::int64_t c = 0; c < C; ++c) {
          am[c] = best_i[c];
          yo[c] = best_i[c] < 0 ? store<T>(A{0}) : x[std::int64_t{best_i[c]} * C + c];
        }
        continue;
      }
      std::fill(acc.begin(), acc.end(), A{0});
      for (std::int64_t e = begin; e < end; ++e) {
        const T* xi = x + std::int64_t{a.in_idx[e]} * C;
        if (a.mode == PoolMode::weighted) {
          const A w = static_cast<A>(a.weights[e]);
          for (std::int64_t c = 0; c < C; ++c) acc[c] += w * load(xi[c]);
        } else {
          for (std::int64_t c = 0; c < C; ++c) acc[c] += load(xi[c]);
        }
      }
      if (a.mode == PoolMode::avg && end > begin) {
        const A n = static_cast<A>(end - begin);
        for (std::int64_t c = 0; c < C; ++c) acc[c] /= n;
      }
      for (std::int64_t c = 0; c < C; ++c) yo[c] = store<T>(acc[c]);
    }
  }
}

// The edges grouped by input row, output row ascending within each input row.
struct InputMajor {
  std::vector<std::int64_t> ptr;   // (n_in + 1)
  std::vector<std::int32_t> out;   // (E) output row of each edge
  std::vector<std::int64_t> edge;  // (E) its position in the output-major list (weighted only)
};

InputMajor input_major(const PoolArgs& a) {
  InputMajor m;
  m.ptr.assign(static_cast<std::size_t>(a.n_in + 1), 0);
  m.out.resize(static_cast<std::size_t>(a.n_edges));
  if (a.mode == PoolMode::weighted) m.edge.resize(static_cast<std::size_t>(a.n_edges));
  for (std::int64_t e = 0; e < a.n_edges; ++e) ++m.ptr[static_cast<std::size_t>(a.in_idx[e]) + 1];
  for (std::int64_t i = 0; i < a.n_in; ++i) m.ptr[i + 1] += m.ptr[i];
  std::vector<std::int64_t> cursor(m.ptr.begin(), m.ptr.end() - 1);
  for (std::int64_t o = 0; o < a.n_out; ++o) {
    for (std::int64_t e = a.out_ptr[o]; e < a.out_ptr[o + 1]; ++e) {
      const std::int64_t p = cursor[a.in_idx[e]]++;
      m.out[p] = static_cast<std::int32_t>(o);
      if (!m.edge.empty()) m.edge[p] = e;
    }
  }
  return m;
}

template <class T>
void input_grad(const PoolArgs& a) {
  using A = Accum<T>;
  const auto* dy = static_cast<const T*>(a.dy);
  auto* dx = static_cast<T*>(a.dx);
  const std::int64_t C = a.channels;
  const InputMajor m = input_major(a);
  const int threads = threads_for(std::max(a.n_edges, a.n_in) * C);
#pragma omp parallel num_threads(threads)
  {
    std::vector<A> acc(static_cast<std::size_t>(C));
#pragma omp for schedule(dynamic, kRowChunk)
    for (std::int64_t i = 0; i < a.n_in; ++i) {
      std::fill(acc.begin(), acc.end(), A{0});
      for (std::int64_t p = m.ptr[i]; p < m.ptr[i + 1]; ++p) {
        const std::int64_t o = m.out[p];
        const T* dyo = dy + o * C;
        switch (a.mode) {
          case PoolMode::sum:
            for (std::int64_t c = 0; c < C; ++c) acc[c] += load(dyo[c]);
            break;
          case PoolMode::avg: {
            const A n = static_cast<A>(a.out_ptr[o + 1] - a.out_ptr[o]);
            for (std::int64_t c = 0; c < C; ++c) acc[c] += load(dyo[c]) / n;
            break;
          }
          case PoolMode::weighted: {
            const A w = static_cast<A>(a.weights[m.edge[p]]);
            for (std::int64_t c = 0; c < C; ++c) acc[c] += w * load(dyo[c]);
            break;
          }
          case PoolMode::max: {
            const std::int32_t* am = a.argmax + o * C;
            for (std::int64_t c = 0; c < C; ++c)
              if (am[c] == i) acc[c] += load(dyo[c]);
            break;
          }
        }
      }
      T* dxi = dx + i * C;
      for (std::int64_t c = 0; c < C; ++c) dxi[c] = store<T>(acc[c]);
    }
  }
}

}  // namespace

void pool_csr_reduce_forward(const PoolArgs& args) {
  LATTICE_ASSERT(args.out_ptr != nullptr, "pool csr_reduce: out_ptr is null");
  dispatch_float(args.dtype, "pool_csr_reduce_forward", "dtype",
                 [&](auto tag) { forward<typename decltype(tag)::type>(args); });
}

void pool_csr_reduce_input_grad(const PoolArgs& args) {
  LATTICE_ASSERT(args.out_ptr != nullptr, "pool csr_reduce: out_ptr is null");
  dispatch_float(args.dtype, "pool_csr_reduce_input_grad", "dtype",
                 [&](auto tag) { input_grad<typename decltype(tag)::type>(args); });
}

}  // namespace lattice::backend::cpu

LATTICE_ROUTE_KERNELS(PoolKernels, pool_csr_reduce, {
    .forward = cpu::pool_csr_reduce_forward,
    .input_grad = cpu::pool_csr_reduce_input_grad});
