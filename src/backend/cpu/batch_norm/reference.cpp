// Constraints: CPU; features (N, C) of any float dtype (f16, bf16, f32, f64) with per-channel
// parameters and statistics in f32 (f64 for f64 features); any N (N >= 2 in training),
// including none, any C; training and eval, forward and backward, optional fused ReLU and
// residual input (added before the ReLU). Deterministic (single-threaded; per channel two passes over the rows in row order, summed
// in double).
//
// The oracle the fast routes are compared with: written for obvious correctness, not speed.
// Per channel: mean = (sum x) / N in double, var = (sum (x - mean)^2) / N in double (two passes),
// invstd = 1 / sqrt(var + eps); y = (x - mean) * invstd * gamma + beta in double, rounded once to
// the storage dtype (then ReLU). Backward: the sums of dy' and dy' * xhat in double, then the
// formulas of backend/args.h (BatchNormArgs). Per-channel outputs are rounded once to Acc.
#include <cmath>
#include <cstdint>

#include "backend/common/batch_norm.h"
#include "backend/kernels.h"

namespace lattice::backend::cpu {
namespace {

template <class T>
void forward_typed(const BatchNormArgs& a) {
  using Acc = Accum<T>;
  const T* x = static_cast<const T*>(a.x);
  T* y = static_cast<T*>(a.y);
  const Acc* gamma = static_cast<const Acc*>(a.gamma);
  const Acc* beta = static_cast<const Acc*>(a.beta);
  Acc* rm = static_cast<Acc*>(a.running_mean);
  Acc* rv = static_cast<Acc*>(a.running_var);
  Acc* mean_out = static_cast<Acc*>(a.mean);
  Acc* invstd_out = static_cast<Acc*>(a.invstd);
  const std::int64_t n = a.n, c = a.c;
  for (std::int64_t ch = 0; ch < c; ++ch) {
    double mean = 0.0, invstd = 0.0;
    if (a.training) {
      double s = 0.0;
      for (std::int64_t i = 0; i < n; ++i) s += static_cast<double>(load(x[i * c + ch]));
      mean = n > 0 ? s / static_cast<double>(n) : 0.0;
      double m2 = 0.0;
      for (std::int64_t i = 0; i < n; ++i) {
        const double d = static_cast<double>(load(x[i * c + ch])) - mean;
        m2 += d * d;
      }
      const double var = n > 0 ? m2 / static_cast<double>(n) : 0.0;
      invstd = batch_norm::inverse_std(var, a.eps);
      if (rm) rm[ch] = static_cast<Acc>(batch_norm::running_update(rm[ch], mean, a.momentum));
      if (rv) rv[ch] = static_cast<Acc>(batch_norm::running_update(rv[ch], batch_norm::unbiased(var, n), a.momentum));
    } else {
      mean = static_cast<double>(rm[ch]);
      invstd = batch_norm::inverse_std(static_cast<double>(rv[ch]), a.eps);
    }
    mean_out[ch] = static_cast<Acc>(mean);
    invstd_out[ch] = static_cast<Acc>(invstd);
    const double g = gamma ? static_cast<double>(gamma[ch]) : 1.0;
    const double b = beta ? static_cast<double>(beta[ch]) : 0.0;
    const T* res = static_cast<const T*>(a.residual);
    for (std::int64_t i = 0; i < n; ++i) {
      double v = (static_cast<double>(load(x[i * c + ch])) - mean) * invstd * g + b;
      if (res) v += static_cast<double>(load(res[i * c + ch]));
      if (a.relu && !(v > 0.0)) v = v != v ? v : 0.0;  // max(v, 0); NaN stays NaN (torch.relu)
      y[i * c + ch] = store<T>(static_cast<Acc>(v));
    }
  }
}

template <class T>
void backward_typed(const BatchNormArgs& a) {
  using Acc = Accum<T>;
  const T* x = static_cast<const T*>(a.x);
  const T* dy = static_cast<const T*>(a.dy);
  const T* ys = static_cast<const T*>(a.y_saved);
  const Acc* gamma = static_cast<const Acc*>(a.gamma);
  const Acc* mean_in = static_cast<const Acc*>(a.mean);
  const Acc* invstd_in = static_cast<const Acc*>(a.invstd);
  T* dx = static_cast<T*>(a.dx);
  Acc* dgamma = static_cast<Acc*>(a.dgamma);
  Acc* dbeta = static_cast<Acc*>(a.dbeta);
  const std::int64_t n = a.n, c = a.c;
  auto grad = [&](std::int64_t k) -> double {
    if (a.relu && !(load(ys[k]) > 0)) return 0.0;
    return static_cast<double>(load(dy[k]));
  };
  for (std::int64_t ch = 0; ch < c; ++ch) {
    const double mean = static_cast<double>(mean_in[ch]);
    const double invstd = static_cast<double>(invstd_in[ch]);
    double sdy = 0.0, sdyx = 0.0;
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t k = i * c + ch;
      const double g = grad(k);
      sdy += g;
      sdyx += g * ((static_cast<double>(load(x[k])) - mean) * invstd);
    }
    if (dgamma) dgamma[ch] = static_cast<Acc>(sdyx);
    if (dbeta) dbeta[ch] = static_cast<Acc>(sdy);
    if (T* dres = static_cast<T*>(a.dresidual)) {  // relu only: dy' itself
      for (std::int64_t i = 0; i < n; ++i) dres[i * c + ch] = load(ys[i * c + ch]) > 0 ? dy[i * c + ch] : store<T>(Acc(0));
    }
    if (!dx) continue;
    const double scale = (gamma ? static_cast<double>(gamma[ch]) : 1.0) * invstd;
    const double k1 = n > 0 ? sdy / static_cast<double>(n) : 0.0;
    const double k2 = n > 0 ? sdyx / static_cast<double>(n) : 0.0;
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t k = i * c + ch;
      const double g = grad(k);
      double v;
      if (a.training) {
        const double xhat = (static_cast<double>(load(x[k])) - mean) * invstd;
        v = scale * (g - k1 - xhat * k2);
      } else {
        v = scale * g;
      }
      dx[k] = store<T>(static_cast<Acc>(v));
    }
  }
}

}  // namespace

void batch_norm_reference_forward(const BatchNormArgs& a) {
  dispatch_float(a.dtype, "batch_norm", "input", [&](auto tag) { forward_typed<typename decltype(tag)::type>(a); });
}

void batch_norm_reference_backward(const BatchNormArgs& a) {
  dispatch_float(a.dtype, "batch_norm", "input", [&](auto tag) { backward_typed<typename decltype(tag)::type>(a); });
}

}  // namespace lattice::backend::cpu

LATTICE_ROUTE_KERNELS(BatchNormKernels, batch_norm_reference, {
    .forward = cpu::batch_norm_reference_forward,
    .backward = cpu::batch_norm_reference_backward});
