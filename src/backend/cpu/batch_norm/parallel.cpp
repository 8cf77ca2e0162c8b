// Constraints: CPU; features (N, C) of any float dtype (f16, bf16, f32, f64) with per-channel
// parameters and statistics in f32 (f64 for f64 features); any N (N >= 2 in training, checked
// by the semantic layer), including none, any C; training and eval, forward and backward,
// optional fused ReLU and residual input (added before the ReLU). Deterministic:
// bitwise-identical results for any thread count (fixed blocks of 32 rows reduced in row order,
// their partials summed in double in a fixed order).
//
// Reductions follow backend/common/batch_norm.h: lattice's OpenMP threads take whole row blocks
// (schedule static over blocks, each block's partials written to their own slots), the
// per-channel sums over the blocks run in fixed_order_sum's order, so no sum depends on the thread
// count (and the cuda route, with the same order and arithmetic, normally gives the same bits).
// Each pass is one parallel region, its steps separated by the worksharing loops' barriers: with
// a region per step, a small layer's forward + backward took ~40 ms instead of ~0.4 ms on the
// 2-core machine while another process held a core (every fork and join waits for a descheduled
// thread); one region per pass keeps the waits to the barriers the steps need.
// Inner loops run over the C channels of one row (contiguous, independent accumulators:
// vectorisable, and the row order of every sum is fixed). Elementwise passes split rows evenly
// over threads.
//
// forward: training 1) per block the mean and M2 of its rows (two passes over the block, still
// in L1), 2) per channel mean = sum n_b m_b / N, var = sum (M2_b + n_b (m_b - mean)^2) / N, invstd,
// running stats, 3) y = (x - mean) * (gamma * invstd) + beta (+ ReLU), in Acc, rounded once.
// Eval: 3) only, with the running statistics. backward: 1) per block sum dy' and sum dy' * xhat,
// 2) per channel their sums in double -> dbeta, dgamma, the means k1, k2, 3) dx (elementwise).
#include <omp.h>

#include <cstdint>
#include <vector>

#include "backend/common/batch_norm.h"
#include "backend/kernels.h"
#include "lattice/core/threads.h"

namespace lattice::backend::cpu {
namespace {

namespace bn = lattice::backend::batch_norm;

// Below this many elements a pass runs on one thread (an OpenMP fork/join costs a few
// microseconds, about as much as 2^15 elements of a pass; an estimate).
constexpr std::int64_t kParallelMinElements = std::int64_t{1} << 15;

int threads_for(std::int64_t work) { return work < kParallelMinElements ? 1 : lattice::num_threads(); }

template <class Acc>
Acc relu_acc(Acc v) {
  return v > Acc(0) || v != v ? v : Acc(0);  // max(v, 0); NaN stays NaN (torch.relu)
}

// Rows [r0, r1) of this thread's even share of n rows (inside a parallel region).
struct RowShare {
  std::int64_t r0, r1;
};
RowShare row_share(std::int64_t n) {
  const std::int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
  return {n * t / nt, n * (t + 1) / nt};
}

// Per block b and channel ch: bmean[ch * blocks + b] = the block's mean, bm2[...] = its sum of
// squared deviations from it (channel-major partials, see backend/common/batch_norm.h). A
// worksharing loop of the enclosing parallel region; acc: this thread's 2 * c accumulators.
template <class T>
void block_moments(const T* __restrict x, std::int64_t n, std::int64_t c, Accum<T>* __restrict bmean,
                   Accum<T>* __restrict bm2, Accum<T>* __restrict acc) {
  using Acc = Accum<T>;
  const std::int64_t blocks = bn::block_count(n);
  Acc* __restrict m = acc;
  Acc* __restrict m2 = acc + c;
#pragma omp for schedule(static)
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::int64_t r0 = b * bn::kBlockRows, nb = bn::block_rows(n, b);
    for (std::int64_t ch = 0; ch < c; ++ch) m[ch] = m2[ch] = Acc(0);
    for (std::int64_t r = r0; r < r0 + nb; ++r) {
      const T* __restrict row = x + r * c;
      for (std::int64_t ch = 0; ch < c; ++ch) m[ch] += load(row[ch]);
    }
    const Acc count = static_cast<Acc>(nb);
    for (std::int64_t ch = 0; ch < c; ++ch) m[ch] = m[ch] / count;
    for (std::int64_t r = r0; r < r0 + nb; ++r) {
      const T* __restrict row = x + r * c;
      for (std::int64_t ch = 0; ch < c; ++ch) {
        const Acc d = load(row[ch]) - m[ch];
        m2[ch] += bn::mul(d, d);
      }
    }
    for (std::int64_t ch = 0; ch < c; ++ch) {
      bmean[ch * blocks + b] = m[ch];
      bm2[ch * blocks + b] = m2[ch];
    }
  }
}

// y = (x - mean) * scale + shift per channel (+ residual) (+ ReLU) on this thread's rows.
template <class T>
void normalize_rows(const T* __restrict x, T* __restrict y, std::int64_t n, std::int64_t c,
                    const Accum<T>* __restrict mean, const Accum<T>* __restrict scale,
                    const Accum<T>* __restrict shift, bool relu, const T* __restrict res) {
  using Acc = Accum<T>;
  const RowShare share = row_share(n);
  for (std::int64_t r = share.r0; r < share.r1; ++r) {
    const T* __restrict xr = x + r * c;
    T* __restrict yr = y + r * c;
    if (res) {  // the residual sum (in Acc, rounded once), then the ReLU
      const T* __restrict rr = res + r * c;
      for (std::int64_t ch = 0; ch < c; ++ch) {
        const Acc v = bn::mul(load(xr[ch]) - mean[ch], scale[ch]) + shift[ch] + load(rr[ch]);
        yr[ch] = store<T>(relu ? relu_acc(v) : v);
      }
    } else if (relu) {
      for (std::int64_t ch = 0; ch < c; ++ch) {
        const Acc v = bn::mul(load(xr[ch]) - mean[ch], scale[ch]) + shift[ch];
        yr[ch] = store<T>(relu_acc(v));
      }
    } else {
      for (std::int64_t ch = 0; ch < c; ++ch) yr[ch] = store<T>(bn::mul(load(xr[ch]) - mean[ch], scale[ch]) + shift[ch]);
    }
  }
}

template <class T>
void forward_typed(const BatchNormArgs& a) {
  using Acc = Accum<T>;
  const T* x = static_cast<const T*>(a.x);
  T* y = static_cast<T*>(a.y);
  const Acc* gamma = static_cast<const Acc*>(a.gamma);
  const Acc* beta = static_cast<const Acc*>(a.beta);
  Acc* rm = static_cast<Acc*>(a.running_mean);
  Acc* rv = static_cast<Acc*>(a.running_var);
  Acc* mean = static_cast<Acc*>(a.mean);
  Acc* invstd = static_cast<Acc*>(a.invstd);
  const std::int64_t n = a.n, c = a.c;
  const std::int64_t blocks = a.training ? bn::block_count(n) : 0;
  std::vector<Acc> bmean(static_cast<std::size_t>(blocks * c)), bm2(static_cast<std::size_t>(blocks * c));
  std::vector<Acc> scale(static_cast<std::size_t>(c)), shift(static_cast<std::size_t>(c));
  const Acc* pm = bmean.data();
  const Acc* pm2 = bm2.data();
  const bool training = a.training, relu = a.relu;
  const double eps = a.eps, momentum = a.momentum;
#pragma omp parallel num_threads(threads_for(n * c))
  {
    if (training) {
      std::vector<Acc> acc(static_cast<std::size_t>(2 * c));
      block_moments(x, n, c, bmean.data(), bm2.data(), acc.data());  // (barrier)
#pragma omp for schedule(static)
      for (std::int64_t ch = 0; ch < c; ++ch) {
        const double m =
            n > 0 ? bn::fixed_order_sum(blocks, [&](std::int64_t b) { return bn::mean_term(pm, n, blocks, ch, b); }) /
                        static_cast<double>(n)
                  : 0.0;
        const double var =
            n > 0 ? bn::fixed_order_sum(blocks,
                                        [&](std::int64_t b) { return bn::m2_term(pm, pm2, n, blocks, ch, b, m); }) /
                        static_cast<double>(n)
                  : 0.0;
        mean[ch] = static_cast<Acc>(m);
        invstd[ch] = static_cast<Acc>(bn::inverse_std(var, eps));
        if (rm) rm[ch] = static_cast<Acc>(bn::running_update(rm[ch], m, momentum));
        if (rv) rv[ch] = static_cast<Acc>(bn::running_update(rv[ch], bn::unbiased(var, n), momentum));
        scale[ch] = gamma ? gamma[ch] * invstd[ch] : invstd[ch];
        shift[ch] = beta ? beta[ch] : Acc(0);
      }  // (barrier)
    } else {
#pragma omp for schedule(static)
      for (std::int64_t ch = 0; ch < c; ++ch) {
        mean[ch] = rm[ch];
        invstd[ch] = static_cast<Acc>(bn::inverse_std(static_cast<double>(rv[ch]), eps));
        scale[ch] = gamma ? gamma[ch] * invstd[ch] : invstd[ch];
        shift[ch] = beta ? beta[ch] : Acc(0);
      }  // (barrier)
    }
    normalize_rows(x, y, n, c, mean, scale.data(), shift.data(), relu, static_cast<const T*>(a.residual));
  }
}

// Per block b and channel ch: bdy[ch * blocks + b] = the sum over its rows of dy', bdyx[...] =
// that of dy' * xhat (row order; channel-major partials). A worksharing loop of the enclosing
// region; acc: this thread's 2 * c accumulators.
template <class T, bool kRelu>
void block_grad_sums(const T* __restrict x, const T* __restrict dy, const T* __restrict ys, std::int64_t n,
                     std::int64_t c, const Accum<T>* __restrict mean, const Accum<T>* __restrict invstd,
                     Accum<T>* __restrict bdy, Accum<T>* __restrict bdyx, Accum<T>* __restrict acc) {
  using Acc = Accum<T>;
  const std::int64_t blocks = bn::block_count(n);
  Acc* __restrict s = acc;
  Acc* __restrict sx = acc + c;
#pragma omp for schedule(static)
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::int64_t r0 = b * bn::kBlockRows, nb = bn::block_rows(n, b);
    for (std::int64_t ch = 0; ch < c; ++ch) s[ch] = sx[ch] = Acc(0);
    for (std::int64_t r = r0; r < r0 + nb; ++r) {
      const T* __restrict xr = x + r * c;
      const T* __restrict dr = dy + r * c;
      const T* __restrict yr = kRelu ? ys + r * c : nullptr;
      for (std::int64_t ch = 0; ch < c; ++ch) {
        Acc g = load(dr[ch]);
        if constexpr (kRelu) g = load(yr[ch]) > Acc(0) ? g : Acc(0);
        const Acc xhat = (load(xr[ch]) - mean[ch]) * invstd[ch];
        s[ch] += g;
        sx[ch] += bn::mul(g, xhat);
      }
    }
    for (std::int64_t ch = 0; ch < c; ++ch) {
      bdy[ch * blocks + b] = s[ch];
      bdyx[ch * blocks + b] = sx[ch];
    }
  }
}

// dx = scale * (dy' - k1 - xhat * k2) (training) or scale * dy' (eval) on this thread's rows.
template <class T, bool kRelu, bool kTraining>
void input_grad_rows(const T* __restrict x, const T* __restrict dy, const T* __restrict ys, std::int64_t n,
                     std::int64_t c, const Accum<T>* __restrict mean, const Accum<T>* __restrict invstd,
                     const Accum<T>* __restrict scale, const Accum<T>* __restrict k1, const Accum<T>* __restrict k2,
                     T* __restrict dx) {
  using Acc = Accum<T>;
  const RowShare share = row_share(n);
  for (std::int64_t r = share.r0; r < share.r1; ++r) {
    const T* __restrict xr = x + r * c;
    const T* __restrict dr = dy + r * c;
    const T* __restrict yr = kRelu ? ys + r * c : nullptr;
    T* __restrict out = dx + r * c;
    for (std::int64_t ch = 0; ch < c; ++ch) {
      Acc g = load(dr[ch]);
      if constexpr (kRelu) g = load(yr[ch]) > Acc(0) ? g : Acc(0);
      if constexpr (kTraining) {
        const Acc xhat = (load(xr[ch]) - mean[ch]) * invstd[ch];
        out[ch] = store<T>(scale[ch] * (g - k1[ch] - bn::mul(xhat, k2[ch])));
      } else {
        out[ch] = store<T>(scale[ch] * g);
      }
    }
  }
}

// dres = dy' (dy where the forward's output is positive) on this thread's rows: the gradient of
// the residual added before the ReLU.
template <class T>
void residual_grad_rows(const T* __restrict dy, const T* __restrict ys, std::int64_t n, std::int64_t c,
                        T* __restrict dres) {
  using Acc = Accum<T>;
  const RowShare share = row_share(n);
  for (std::int64_t r = share.r0; r < share.r1; ++r) {
    const T* __restrict dr = dy + r * c;
    const T* __restrict yr = ys + r * c;
    T* __restrict out = dres + r * c;
    for (std::int64_t ch = 0; ch < c; ++ch) out[ch] = load(yr[ch]) > Acc(0) ? dr[ch] : store<T>(Acc(0));
  }
}

template <class T, bool kRelu>
void backward_relu_typed(const BatchNormArgs& a) {
  using Acc = Accum<T>;
  const T* x = static_cast<const T*>(a.x);
  const T* dy = static_cast<const T*>(a.dy);
  const T* ys = static_cast<const T*>(a.y_saved);
  const Acc* gamma = static_cast<const Acc*>(a.gamma);
  const Acc* mean = static_cast<const Acc*>(a.mean);
  const Acc* invstd = static_cast<const Acc*>(a.invstd);
  T* dx = static_cast<T*>(a.dx);
  Acc* dgamma = static_cast<Acc*>(a.dgamma);
  Acc* dbeta = static_cast<Acc*>(a.dbeta);
  const std::int64_t n = a.n, c = a.c;
  const bool training = a.training;
  const bool need_sums = dgamma || (dx && training);
  const std::int64_t blocks = need_sums ? bn::block_count(n) : 0;
  std::vector<Acc> bdy(static_cast<std::size_t>(blocks * c)), bdyx(static_cast<std::size_t>(blocks * c));
  std::vector<Acc> k1(static_cast<std::size_t>(c), Acc(0)), k2(static_cast<std::size_t>(c), Acc(0));
  std::vector<Acc> scale(static_cast<std::size_t>(c));
  const Acc* pdy = bdy.data();
  const Acc* pdyx = bdyx.data();
#pragma omp parallel num_threads(threads_for(n * c))
  {
    if (need_sums) {
      std::vector<Acc> acc(static_cast<std::size_t>(2 * c));
      block_grad_sums<T, kRelu>(x, dy, ys, n, c, mean, invstd, bdy.data(), bdyx.data(), acc.data());  // (barrier)
    }
#pragma omp for schedule(static)
    for (std::int64_t ch = 0; ch < c; ++ch) {
      scale[ch] = gamma ? gamma[ch] * invstd[ch] : invstd[ch];
      if (!need_sums) continue;
      const double sdy = bn::fixed_order_sum(blocks, [&](std::int64_t b) { return double(pdy[ch * blocks + b]); });
      const double sdyx = bn::fixed_order_sum(blocks, [&](std::int64_t b) { return double(pdyx[ch * blocks + b]); });
      if (dgamma) dgamma[ch] = static_cast<Acc>(sdyx);
      if (dbeta) dbeta[ch] = static_cast<Acc>(sdy);
      if (n > 0) {
        k1[ch] = static_cast<Acc>(sdy / static_cast<double>(n));
        k2[ch] = static_cast<Acc>(sdyx / static_cast<double>(n));
      }
    }  // (barrier)
    if constexpr (kRelu) {
      if (a.dresidual) residual_grad_rows(dy, ys, n, c, static_cast<T*>(a.dresidual));
    }
    if (dx) {
      if (training)
        input_grad_rows<T, kRelu, true>(x, dy, ys, n, c, mean, invstd, scale.data(), k1.data(), k2.data(), dx);
      else
        input_grad_rows<T, kRelu, false>(x, dy, ys, n, c, mean, invstd, scale.data(), k1.data(), k2.data(), dx);
    }
  }
}

template <class T>
void backward_typed(const BatchNormArgs& a) {
  if (a.relu)
    backward_relu_typed<T, true>(a);
  else
    backward_relu_typed<T, false>(a);
}

}  // namespace

void batch_norm_parallel_forward(const BatchNormArgs& a) {
  dispatch_float(a.dtype, "batch_norm", "input", [&](auto tag) { forward_typed<typename decltype(tag)::type>(a); });
}

void batch_norm_parallel_backward(const BatchNormArgs& a) {
  dispatch_float(a.dtype, "batch_norm", "input", [&](auto tag) { backward_typed<typename decltype(tag)::type>(a); });
}

}  // namespace lattice::backend::cpu

LATTICE_ROUTE_KERNELS(BatchNormKernels, batch_norm_parallel, {
    .forward = cpu::batch_norm_parallel_forward,
    .backward = cpu::batch_norm_parallel_backward});
