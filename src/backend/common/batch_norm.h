// The reduction order of the blocked batch norm routes (cpu `parallel`, `cuda`), shared so that
// both compute their per-channel statistics the same way, independent of threads and grids:
//
//   rows are cut into fixed blocks of kBatchNormBlockRows (the last one shorter); per (block,
//   channel) a route computes, in its accumulation type Acc (f32, f64 for f64 features), summing
//   the block's rows in ascending order:
//     forward (training): the block mean m_b = (sum x) / n_b, then M2_b = sum (x - m_b)^2
//       (two passes over the block: no E[x^2] - E[x]^2 cancellation for large means);
//     backward: sum dy' and sum dy' * xhat;
//   then per channel the blocks are combined in block order in double: Chan's parallel variance
//   for (n_b, m_b, M2_b), plain sums for the backward. Nothing here depends on how blocks are
//   spread over threads, so the results are bitwise the same for every thread count and grid.
#pragma once

#include <cmath>
#include <cstdint>

#include "backend/common/geometry.h"  // LATTICE_HD

namespace lattice::backend::batch_norm {

constexpr std::int64_t kBlockRows = 256;

// a * b rounded on its own, never contracted with a following add into an FMA (nvcc contracts by
// default, the host compiler of this build does not): the CPU and CUDA routes then round alike.
template <class Acc>
LATTICE_HD Acc mul(Acc a, Acc b) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(Acc) == 8) return __dmul_rn(a, b);
  else return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

LATTICE_HD std::int64_t block_count(std::int64_t n) { return (n + kBlockRows - 1) / kBlockRows; }
LATTICE_HD std::int64_t block_rows(std::int64_t n, std::int64_t b) {
  const std::int64_t r = n - b * kBlockRows;
  return r < kBlockRows ? r : kBlockRows;
}

// Channel statistics from the block partials bmean / bm2 (blocks x c, block-major) of channel ch:
// mean and biased variance (M2 / n) of all n rows, in double.
template <class Acc>
LATTICE_HD void combine_blocks(const Acc* bmean, const Acc* bm2, std::int64_t n, std::int64_t c, std::int64_t ch,
                               double& mean, double& var) {
  const std::int64_t blocks = block_count(n);
  double count = 0.0, m = 0.0, m2 = 0.0;
  for (std::int64_t b = 0; b < blocks; ++b) {
    const double nb = static_cast<double>(block_rows(n, b));
    const double mb = static_cast<double>(bmean[b * c + ch]);
    const double m2b = static_cast<double>(bm2[b * c + ch]);
    const double total = count + nb;
    const double delta = mb - m;
    m += mul(delta, nb / total);
    m2 += m2b + mul(mul(delta, delta), mul(count, nb) / total);
    count = total;
  }
  mean = m;
  var = n > 0 ? m2 / static_cast<double>(n) : 0.0;
}

// Sums of the blocks' partials of channel ch, in block order, in double.
template <class Acc>
LATTICE_HD double sum_blocks(const Acc* part, std::int64_t n, std::int64_t c, std::int64_t ch) {
  const std::int64_t blocks = block_count(n);
  double s = 0.0;
  for (std::int64_t b = 0; b < blocks; ++b) s += static_cast<double>(part[b * c + ch]);
  return s;
}

// 1 / sqrt(var + eps) in double (rounded to Acc once by the caller).
LATTICE_HD double inverse_std(double var, double eps) { return 1.0 / sqrt(var + eps); }

// The running-statistic update of torch.nn.BatchNorm1d: (1 - momentum) * running + momentum * batch.
LATTICE_HD double running_update(double running, double batch, double momentum) {
  return mul(1.0 - momentum, running) + mul(momentum, batch);
}

// The unbiased variance n / (n - 1) * var of n >= 2 rows.
LATTICE_HD double unbiased(double var, std::int64_t n) {
  return n > 1 ? mul(var, static_cast<double>(n) / static_cast<double>(n - 1)) : var;
}

}  // namespace lattice::backend::batch_norm
