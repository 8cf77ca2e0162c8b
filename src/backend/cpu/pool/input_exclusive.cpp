// Constraints: CPU; any float dtype (f16, bf16, f32, f64); any pool mode; input_grad only; every
// input row has at most one edge. Admitted for forward / target relations whose windows are
// disjoint (stride >= (size-1)*dilation + 1 on every axis) and for global pooling (each row
// belongs to one batch). Deterministic, and equal to the reference route.
//
// Each input row feeds at most one output row, so the input gradient needs no reduction: a
// scatter of output row ids to their input rows (no two edges share an input, so no races),
// then a gather per input row, OpenMP over rows. dx[i] = 0 + term (the same single term the
// reference sums; starting from 0 keeps -0.0 identical).
//
// Shapes (named axes; C = channels, E = edges): dy (n_out, C), argmax (n_out, C) int32,
// dx (n_in, C), weights (E) float64. Buffers: int32 (N_in) owner rows and int64 (N_in) owner
// edges.
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

int threads_for(std::int64_t work) { return work < kParallelMinWork ? 1 : num_threads(); }

template <class T>
void input_grad(const PoolArgs& a) {
  using A = Accum<T>;
  const auto* dy = static_cast<const T*>(a.dy);
  auto* dx = static_cast<T*>(a.dx);
  const std::int64_t C = a.channels;
  std::vector<std::int32_t> owner(static_cast<std::size_t>(a.n_in), -1);
  std::vector<std::int64_t> owner_edge(static_cast<std::size_t>(a.n_in), -1);
  const int scatter_threads = threads_for(a.n_edges);
#pragma omp parallel for schedule(static) num_threads(scatter_threads)
  for (std::int64_t o = 0; o < a.n_out; ++o) {
    for (std::int64_t e = a.out_ptr[o]; e < a.out_ptr[o + 1]; ++e) {
      owner[a.in_idx[e]] = static_cast<std::int32_t>(o);
      owner_edge[a.in_idx[e]] = e;
    }
  }
  const int threads = threads_for(a.n_in * C);
#pragma omp parallel for schedule(static) num_threads(threads)
  for (std::int64_t i = 0; i < a.n_in; ++i) {
    T* dxi = dx + i * C;
    const std::int64_t o = owner[i];
    if (o < 0) {
      for (std::int64_t c = 0; c < C; ++c) dxi[c] = store<T>(A{0});
      continue;
    }
    const T* dyo = dy + o * C;
    switch (a.mode) {
      case PoolMode::sum:
        for (std::int64_t c = 0; c < C; ++c) dxi[c] = store<T>(A{0} + load(dyo[c]));
        break;
      case PoolMode::avg: {
        const A n = static_cast<A>(a.out_ptr[o + 1] - a.out_ptr[o]);
        for (std::int64_t c = 0; c < C; ++c) dxi[c] = store<T>(A{0} + load(dyo[c]) / n);
        break;
      }
      case PoolMode::weighted: {
        const A w = static_cast<A>(a.weights[owner_edge[i]]);
        for (std::int64_t c = 0; c < C; ++c) dxi[c] = store<T>(A{0} + w * load(dyo[c]));
        break;
      }
      case PoolMode::max: {
        const std::int32_t* am = a.argmax + o * C;
        for (std::int64_t c = 0; c < C; ++c)
          dxi[c] = store<T>(am[c] == i ? A{0} + load(dyo[c]) : A{0});
        break;
      }
    }
  }
}

}  // namespace

void pool_input_exclusive_input_grad(const PoolArgs& args) {
  LATTICE_ASSERT(args.out_ptr != nullptr, "pool input_exclusive: out_ptr is null");
  dispatch_float(args.dtype, "pool_input_exclusive_input_grad", "dtype",
                 [&](auto tag) { input_grad<typename decltype(tag)::type>(args); });
}

}  // namespace lattice::backend::cpu

LATTICE_ROUTE_KERNELS(PoolKernels, pool_input_exclusive, {
    .input_grad = cpu::pool_input_exclusive_input_grad});
