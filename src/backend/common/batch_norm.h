// The reduction order of the blocked batch norm routes (cpu `parallel`, `cuda`), shared so that
// both compute their per-channel statistics the same way, independent of threads and grids:
//
//   rows are cut into fixed blocks of kBlockRows (the last one shorter); per (block, channel) a
//   route computes, in its accumulation type Acc (f32, f64 for f64 features), summing the
//   block's rows in ascending order:
//     forward (training): the block mean m_b = (sum x) / n_b, then M2_b = sum (x - m_b)^2
//       (two passes over the block: no E[x^2] - E[x]^2 cancellation for large means);
//     backward: sum dy' and sum dy' * xhat;
//   the partials are stored channel-major (part[ch * blocks + b]); then per channel the blocks
//   are summed in double in the fixed order of fixed_order_sum (kLanes lanes, lane l taking
//   blocks l, l + kLanes, ... in increasing order, the lanes combined by a halving tree: what one
//   CUDA warp per channel does with shfl_down):
//     mean = (sum n_b * m_b) / N, then M2 = sum (M2_b + n_b * (m_b - mean)^2) (exact algebra of
//     the parallel variance, every term a product or square of deviations: stable), var = M2 / N;
//     backward: sum dy' and sum dy' * xhat.
//   Nothing depends on how blocks are spread over threads, so the results are bitwise the same
//   for every thread count and grid, and the CPU and CUDA routes round alike.
#pragma once

#include <cmath>
#include <cstdint>

#include "backend/common/geometry.h"  // LATTICE_HD

namespace lattice::backend::batch_norm {

constexpr std::int64_t kBlockRows = 32;
constexpr int kLanes = 32;

LATTICE_HD std::int64_t block_count(std::int64_t n) { return (n + kBlockRows - 1) / kBlockRows; }
LATTICE_HD std::int64_t block_rows(std::int64_t n, std::int64_t b) {
  const std::int64_t r = n - b * kBlockRows;
  return r < kBlockRows ? r : kBlockRows;
}

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

// The term block b of channel ch contributes to each per-channel sum (part: channel-major).
template <class Acc>
LATTICE_HD double mean_term(const Acc* bmean, std::int64_t n, std::int64_t blocks, std::int64_t ch, std::int64_t b) {
  return mul(static_cast<double>(block_rows(n, b)), static_cast<double>(bmean[ch * blocks + b]));
}
template <class Acc>
LATTICE_HD double m2_term(const Acc* bmean, const Acc* bm2, std::int64_t n, std::int64_t blocks, std::int64_t ch,
                          std::int64_t b, double mean) {
  const double d = static_cast<double>(bmean[ch * blocks + b]) - mean;
  return static_cast<double>(bm2[ch * blocks + b]) + mul(static_cast<double>(block_rows(n, b)), mul(d, d));
}

// sum over b < blocks of term(b) in the fixed lane order (host side; the CUDA route's warp
// reduction is the same order).
template <class F>
inline double fixed_order_sum(std::int64_t blocks, F term) {
  double lane[kLanes] = {};
  for (std::int64_t b = 0; b < blocks; ++b) lane[b % kLanes] += term(b);
  for (int off = kLanes / 2; off > 0; off /= 2)
    for (int l = 0; l < off; ++l) lane[l] += lane[l + off];
  return lane[0];
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
