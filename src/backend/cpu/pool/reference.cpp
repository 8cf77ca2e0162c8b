// Constraints: CPU; any float dtype (f16, bf16, f32, f64); any pool mode (sum, avg, max,
// weighted), any edge list (including none), forward and input_grad. Deterministic
// (single-threaded, fixed order).
//
// The scalar reference route: plain loops over the output-major edge list, written to be
// obviously correct rather than fast. The other pooling routes are tested against it.
//
// Shapes (named axes; C = channels, E = edges): x (n_in, C), y (n_out, C), argmax (n_out, C)
// int32, dy (n_out, C), dx (n_in, C), weights (E) float64.
// Numerics: sums in Accum<T> (f32 for f16/bf16/f32, f64 for f64), rounded to T once; orders as
// in pool_routes.h. Max copies the winning element (no rounding).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/cpu/pool/pool_routes.h"
#include "backend/kernels.h"
#include "lattice/core/error.h"

namespace lattice::backend::cpu {
namespace {

template <class T>
void forward(const PoolArgs& a) {
  using A = Accum<T>;
  const auto* x = static_cast<const T*>(a.x);
  auto* y = static_cast<T*>(a.y);
  const std::int64_t C = a.channels;
  std::vector<A> acc(static_cast<std::size_t>(C));
  for (std::int64_t o = 0; o < a.n_out; ++o) {
    const std::int64_t begin = a.out_ptr[o], end = a.out_ptr[o + 1];
    if (a.mode == PoolMode::max) {
      for (std::int64_t c = 0; c < C; ++c) {
        std::int32_t best_i = -1;
        A best{0};
        for (std::int64_t e = begin; e < end; ++e) {
          const std::int32_t i = a.in_idx[e];
          const A v = load(x[std::int64_t{i} * C + c]);
          if (best_i < 0 || pool_detail::max_beats(v, i, best, best_i)) {
            best = v;
            best_i = i;
          }
        }
        y[o * C + c] = best_i < 0 ? store<T>(A{0}) : x[std::int64_t{best_i} * C + c];
        a.argmax[o * C + c] = best_i;
      }
      continue;
    }
    for (std::int64_t c = 0; c < C; ++c) acc[c] = A{0};
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
    for (std::int64_t c = 0; c < C; ++c) y[o * C + c] = store<T>(acc[c]);
  }
}

template <class T>
void input_grad(const PoolArgs& a) {
  using A = Accum<T>;
  const auto* dy = static_cast<const T*>(a.dy);
  auto* dx = static_cast<T*>(a.dx);
  const std::int64_t C = a.channels;
  std::vector<A> acc(static_cast<std::size_t>(a.n_in * C), A{0});
  for (std::int64_t o = 0; o < a.n_out; ++o) {
    const T* dyo = dy + o * C;
    if (a.mode == PoolMode::max) {
      for (std::int64_t c = 0; c < C; ++c) {
        const std::int32_t i = a.argmax[o * C + c];
        if (i >= 0) acc[std::int64_t{i} * C + c] += load(dyo[c]);
      }
      continue;
    }
    const std::int64_t begin = a.out_ptr[o], end = a.out_ptr[o + 1];
    for (std::int64_t e = begin; e < end; ++e) {
      A* dxi = acc.data() + std::int64_t{a.in_idx[e]} * C;
      if (a.mode == PoolMode::sum) {
        for (std::int64_t c = 0; c < C; ++c) dxi[c] += load(dyo[c]);
      } else if (a.mode == PoolMode::avg) {
        const A n = static_cast<A>(end - begin);
        for (std::int64_t c = 0; c < C; ++c) dxi[c] += load(dyo[c]) / n;
      } else {
        const A w = static_cast<A>(a.weights[e]);
        for (std::int64_t c = 0; c < C; ++c) dxi[c] += w * load(dyo[c]);
      }
    }
  }
  for (std::int64_t j = 0; j < a.n_in * C; ++j) dx[j] = store<T>(acc[j]);
}

void check(const PoolArgs& a, bool forward_pass) {
  LATTICE_ASSERT(a.out_ptr != nullptr, "pool reference: out_ptr is null");
  LATTICE_ASSERT(a.n_edges == 0 || a.in_idx != nullptr, "pool reference: in_idx is null");
  LATTICE_ASSERT(a.mode != PoolMode::weighted || a.n_edges == 0 || a.weights != nullptr,
                 "pool reference: weights are null");
  LATTICE_ASSERT(a.mode != PoolMode::max || a.argmax != nullptr || a.n_out * a.channels == 0,
                 "pool reference: argmax is null");
  LATTICE_ASSERT(
      forward_pass ? (a.x || a.n_in * a.channels == 0) : (a.dy || a.n_out * a.channels == 0),
      "pool reference: input features are null");
}

}  // namespace

void pool_reference_forward(const PoolArgs& args) {
  check(args, true);
  dispatch_float(args.dtype, "pool_reference_forward", "dtype",
                 [&](auto tag) { forward<typename decltype(tag)::type>(args); });
}

void pool_reference_input_grad(const PoolArgs& args) {
  check(args, false);
  dispatch_float(args.dtype, "pool_reference_input_grad", "dtype",
                 [&](auto tag) { input_grad<typename decltype(tag)::type>(args); });
}

}  // namespace lattice::backend::cpu

LATTICE_ROUTE_KERNELS(PoolKernels, pool_reference, {
    .forward = cpu::pool_reference_forward,
    .input_grad = cpu::pool_reference_input_grad});
