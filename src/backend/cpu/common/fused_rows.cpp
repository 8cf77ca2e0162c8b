// Fused gather-GEMM-scatter kernels for f32 (see fused_rows.h). The 256-bit FMA code is compiled
// with a function-level target attribute ("avx,fma": it uses float vectors only, no AVX2 integer
// instructions, so it also runs on CPUs and virtual machines that expose AVX and FMA without AVX2)
// and chosen at run time, so the library still runs on any x86-64 (and on other ISAs, where
// fused_rows_available() is false).
#include "backend/cpu/common/fused_rows.h"
#include "backend/cpu/common/gemm_support.h"  // prefetch_row

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "lattice/core/error.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LATTICE_FUSED_X86 1
#include <immintrin.h>
#define LATTICE_AVX_FMA __attribute__((target("avx,fma")))
#else
#define LATTICE_FUSED_X86 0
#endif

namespace lattice::backend::cpu::detail {
namespace {

std::atomic<bool> g_enabled{true};

bool cpu_has_avx_fma() {
#if LATTICE_FUSED_X86
  static const bool has = __builtin_cpu_supports("avx") && __builtin_cpu_supports("fma");
  return has;
#else
  return false;
#endif
}

#if LATTICE_FUSED_X86
// Rows of the next tile this far ahead are requested while the current tile runs (source rows
// 1-2 KB apart are cache misses the hardware prefetchers do not predict).
constexpr std::int64_t kRowsPerTile = 6;

// d[j] += (lo, hi)[j] for j < ncols (<= 16).
LATTICE_AVX_FMA inline void add_row(float* d, __m256 lo, __m256 hi, std::int64_t ncols) {
  if (ncols == kPanelCols) {
    _mm256_storeu_ps(d, _mm256_add_ps(_mm256_loadu_ps(d), lo));
    _mm256_storeu_ps(d + 8, _mm256_add_ps(_mm256_loadu_ps(d + 8), hi));
    return;
  }
  alignas(32) float t[kPanelCols];
  _mm256_store_ps(t, lo);
  _mm256_store_ps(t + 8, hi);
  for (std::int64_t j = 0; j < ncols; ++j) d[j] += t[j];
}

// c[r][col0 + j] += dot(a[r][0, c_src), column j of the panel) for r < R, j < ncols; the panel bp is
// (c_src, 16). The dot product runs over ci in ascending order (one FMA chain per element), then
// one add into c. Accumulators are named variables, not an array: GCC kept an array of __m256 in
// memory and stored all twelve of them on every step (the first version ran at half speed).
template <int R>
LATTICE_AVX_FMA inline void tile(const float* const* a, std::int64_t c_src, const float* bp,
                                  float* const* c, std::int64_t col0, std::int64_t ncols) {
  static_assert(R >= 1 && R <= 6);
  __m256 l0 = _mm256_setzero_ps(), h0 = l0, l1 = l0, h1 = l0, l2 = l0, h2 = l0, l3 = l0, h3 = l0,
         l4 = l0, h4 = l0, l5 = l0, h5 = l0;
  const float* a0 = a[0];
  const float* a1 = R > 1 ? a[1] : a0;
  const float* a2 = R > 2 ? a[2] : a0;
  const float* a3 = R > 3 ? a[3] : a0;
  const float* a4 = R > 4 ? a[4] : a0;
  const float* a5 = R > 5 ? a[5] : a0;
  for (std::int64_t ci = 0; ci < c_src; ++ci) {
    const __m256 b0 = _mm256_load_ps(bp + ci * kPanelCols);
    const __m256 b1 = _mm256_load_ps(bp + ci * kPanelCols + 8);
    __m256 av = _mm256_broadcast_ss(a0 + ci);
    l0 = _mm256_fmadd_ps(av, b0, l0);
    h0 = _mm256_fmadd_ps(av, b1, h0);
    if constexpr (R > 1) {
      av = _mm256_broadcast_ss(a1 + ci);
      l1 = _mm256_fmadd_ps(av, b0, l1);
      h1 = _mm256_fmadd_ps(av, b1, h1);
    }
    if constexpr (R > 2) {
      av = _mm256_broadcast_ss(a2 + ci);
      l2 = _mm256_fmadd_ps(av, b0, l2);
      h2 = _mm256_fmadd_ps(av, b1, h2);
    }
    if constexpr (R > 3) {
      av = _mm256_broadcast_ss(a3 + ci);
      l3 = _mm256_fmadd_ps(av, b0, l3);
      h3 = _mm256_fmadd_ps(av, b1, h3);
    }
    if constexpr (R > 4) {
      av = _mm256_broadcast_ss(a4 + ci);
      l4 = _mm256_fmadd_ps(av, b0, l4);
      h4 = _mm256_fmadd_ps(av, b1, h4);
    }
    if constexpr (R > 5) {
      av = _mm256_broadcast_ss(a5 + ci);
      l5 = _mm256_fmadd_ps(av, b0, l5);
      h5 = _mm256_fmadd_ps(av, b1, h5);
    }
  }
  add_row(c[0] + col0, l0, h0, ncols);
  if constexpr (R > 1) add_row(c[1] + col0, l1, h1, ncols);
  if constexpr (R > 2) add_row(c[2] + col0, l2, h2, ncols);
  if constexpr (R > 3) add_row(c[3] + col0, l3, h3, ncols);
  if constexpr (R > 4) add_row(c[4] + col0, l4, h4, ncols);
  if constexpr (R > 5) add_row(c[5] + col0, l5, h5, ncols);
}

LATTICE_AVX_FMA void fused_rows_fma(const float* src, std::int64_t c_src, const std::int32_t* src_rows,
                                      const std::int32_t* dst_rows, std::int64_t r0, std::int64_t r1,
                                      const float* packed_w, std::int64_t c_dst, float* acc) {
  const std::int64_t panels = (c_dst + kPanelCols - 1) / kPanelCols;
  const std::int64_t src_bytes = c_src * static_cast<std::int64_t>(sizeof(float));
  const std::int64_t dst_bytes = c_dst * static_cast<std::int64_t>(sizeof(float));
  for (std::int64_t g = r0; g < r1; g += kRowsPerTile) {
    const int rows = static_cast<int>(std::min(kRowsPerTile, r1 - g));
    // the next tile's rows, requested now
    for (std::int64_t r = g + kRowsPerTile; r < std::min(r1, g + 2 * kRowsPerTile); ++r) {
      prefetch_row(src + std::int64_t{src_rows[r]} * c_src, src_bytes);
      prefetch_row(acc + std::int64_t{dst_rows[r]} * c_dst, dst_bytes, true);
    }
    const float* a[kRowsPerTile];
    float* c[kRowsPerTile];
    for (int r = 0; r < rows; ++r) {
      a[r] = src + std::int64_t{src_rows[g + r]} * c_src;
      c[r] = acc + std::int64_t{dst_rows[g + r]} * c_dst;
    }
    for (std::int64_t p = 0; p < panels; ++p) {
      const float* bp = packed_w + p * c_src * kPanelCols;
      const std::int64_t col0 = p * kPanelCols;
      const std::int64_t ncols = std::min(kPanelCols, c_dst - col0);
      switch (rows) {
        case 6: tile<6>(a, c_src, bp, c, col0, ncols); break;
        case 5: tile<5>(a, c_src, bp, c, col0, ncols); break;
        case 4: tile<4>(a, c_src, bp, c, col0, ncols); break;
        case 3: tile<3>(a, c_src, bp, c, col0, ncols); break;
        case 2: tile<2>(a, c_src, bp, c, col0, ncols); break;
        default: tile<1>(a, c_src, bp, c, col0, ncols); break;
      }
    }
  }
}

// The lanes j < n (n <= 16, negative counts as 0) of an 8-lane mask: eight int32 loaded from a
// table of 16 set words followed by 16 clear ones (a plain AVX load: AVX2's integer compare that
// built it before is absent on AVX-only CPUs).
LATTICE_AVX_FMA inline __m256i tail_mask(std::int64_t n) {
  alignas(32) static constexpr std::int32_t kTable[32] = {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                                          -1, -1, -1, -1, -1, 0,  0,  0,  0,  0,  0,
                                                          0,  0,  0,  0,  0,  0,  0,  0,  0,  0};
  const std::int64_t k = std::clamp<std::int64_t>(n, 0, 16);
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kTable + 16 - k));
}

// dw[r * ld + j] += sum_e xp[e][cx0 + r] * dp[e][co0 + j] for r < R, j < ncols: R rows of a
// weight gradient by 16 columns, summed over the block's edges in order (one FMA chain per
// element), then one add into dw. kTail: ncols < 16, dy read with masked loads (the row ends).
template <int R, bool kTail>
LATTICE_AVX_FMA inline void wg_tile(const float* const* xp, const float* const* dp, std::int64_t m,
                                     std::int64_t cx0, std::int64_t co0, float* dw, std::int64_t ld,
                                     std::int64_t ncols) {
  static_assert(R >= 1 && R <= 6);
  __m256i mask_lo = _mm256_setzero_si256(), mask_hi = mask_lo;
  if constexpr (kTail) {  // lane j of mask_lo set iff j < ncols, of mask_hi iff j + 8 < ncols
    mask_lo = tail_mask(ncols);
    mask_hi = tail_mask(ncols - 8);
  }
  __m256 l0 = _mm256_setzero_ps(), h0 = l0, l1 = l0, h1 = l0, l2 = l0, h2 = l0, l3 = l0, h3 = l0,
         l4 = l0, h4 = l0, l5 = l0, h5 = l0;
  for (std::int64_t e = 0; e < m; ++e) {
    const float* xr = xp[e] + cx0;
    const float* dr = dp[e] + co0;
    __m256 b0, b1;
    if constexpr (kTail) {
      b0 = _mm256_maskload_ps(dr, mask_lo);
      b1 = _mm256_maskload_ps(dr + 8, mask_hi);
    } else {
      b0 = _mm256_loadu_ps(dr);
      b1 = _mm256_loadu_ps(dr + 8);
    }
    __m256 av = _mm256_broadcast_ss(xr);
    l0 = _mm256_fmadd_ps(av, b0, l0);
    h0 = _mm256_fmadd_ps(av, b1, h0);
    if constexpr (R > 1) {
      av = _mm256_broadcast_ss(xr + 1);
      l1 = _mm256_fmadd_ps(av, b0, l1);
      h1 = _mm256_fmadd_ps(av, b1, h1);
    }
    if constexpr (R > 2) {
      av = _mm256_broadcast_ss(xr + 2);
      l2 = _mm256_fmadd_ps(av, b0, l2);
      h2 = _mm256_fmadd_ps(av, b1, h2);
    }
    if constexpr (R > 3) {
      av = _mm256_broadcast_ss(xr + 3);
      l3 = _mm256_fmadd_ps(av, b0, l3);
      h3 = _mm256_fmadd_ps(av, b1, h3);
    }
    if constexpr (R > 4) {
      av = _mm256_broadcast_ss(xr + 4);
      l4 = _mm256_fmadd_ps(av, b0, l4);
      h4 = _mm256_fmadd_ps(av, b1, h4);
    }
    if constexpr (R > 5) {
      av = _mm256_broadcast_ss(xr + 5);
      l5 = _mm256_fmadd_ps(av, b0, l5);
      h5 = _mm256_fmadd_ps(av, b1, h5);
    }
  }
  add_row(dw, l0, h0, ncols);
  if constexpr (R > 1) add_row(dw + ld, l1, h1, ncols);
  if constexpr (R > 2) add_row(dw + 2 * ld, l2, h2, ncols);
  if constexpr (R > 3) add_row(dw + 3 * ld, l3, h3, ncols);
  if constexpr (R > 4) add_row(dw + 4 * ld, l4, h4, ncols);
  if constexpr (R > 5) add_row(dw + 5 * ld, l5, h5, ncols);
}

template <bool kTail>
LATTICE_AVX_FMA inline void wg_tile_rows(int rows, const float* const* xp, const float* const* dp,
                                          std::int64_t m, std::int64_t cx0, std::int64_t co0, float* dw,
                                          std::int64_t ld, std::int64_t ncols) {
  switch (rows) {
    case 6: wg_tile<6, kTail>(xp, dp, m, cx0, co0, dw, ld, ncols); break;
    case 5: wg_tile<5, kTail>(xp, dp, m, cx0, co0, dw, ld, ncols); break;
    case 4: wg_tile<4, kTail>(xp, dp, m, cx0, co0, dw, ld, ncols); break;
    case 3: wg_tile<3, kTail>(xp, dp, m, cx0, co0, dw, ld, ncols); break;
    case 2: wg_tile<2, kTail>(xp, dp, m, cx0, co0, dw, ld, ncols); break;
    default: wg_tile<1, kTail>(xp, dp, m, cx0, co0, dw, ld, ncols); break;
  }
}

LATTICE_AVX_FMA void fused_weight_grad_fma(const float* x, std::int64_t c_x, const std::int32_t* x_rows,
                                             const float* dy, std::int64_t c_dy, const std::int32_t* dy_rows,
                                             std::int64_t n, std::int64_t c0, std::int64_t c1, float* dw) {
  const std::int64_t cw = c1 - c0;
  const std::int64_t block = fused_weight_grad_edge_block(cw, c_dy);
  const std::int64_t row_tiles = (cw + kRowsPerTile - 1) / kRowsPerTile;
  const std::int64_t panels = (c_dy + kPanelCols - 1) / kPanelCols;
  const std::int64_t tiles = row_tiles * panels;
  const std::int64_t x_bytes = cw * static_cast<std::int64_t>(sizeof(float));
  const std::int64_t dy_bytes = c_dy * static_cast<std::int64_t>(sizeof(float));
  const float* xp[kMaxWeightGradBlock];
  const float* dp[kMaxWeightGradBlock];
  std::fill_n(dw, cw * c_dy, 0.0F);
  for (std::int64_t b0 = 0; b0 < n; b0 += block) {
    const std::int64_t m = std::min(block, n - b0);
    for (std::int64_t e = 0; e < m; ++e) {
      xp[e] = x + std::int64_t{x_rows[b0 + e]} * c_x;
      dp[e] = dy + std::int64_t{dy_rows[b0 + e]} * c_dy;
    }
    // the next block's rows, requested a slice per tile while this block runs
    const std::int64_t next0 = b0 + m;
    const std::int64_t next_m = std::min(block, n - next0);
    std::int64_t t = 0;
    for (std::int64_t rt = 0; rt < row_tiles; ++rt) {
      const int rows = static_cast<int>(std::min(kRowsPerTile, cw - rt * kRowsPerTile));
      for (std::int64_t p = 0; p < panels; ++p, ++t) {
        if (next_m > 0) {
          for (std::int64_t e = t * next_m / tiles; e < (t + 1) * next_m / tiles; ++e) {
            prefetch_row(x + std::int64_t{x_rows[next0 + e]} * c_x + c0, x_bytes);
            prefetch_row(dy + std::int64_t{dy_rows[next0 + e]} * c_dy, dy_bytes);
          }
        }
        const std::int64_t co0 = p * kPanelCols;
        const std::int64_t ncols = std::min(kPanelCols, c_dy - co0);
        float* d = dw + rt * kRowsPerTile * c_dy + co0;
        if (ncols == kPanelCols) {
          wg_tile_rows<false>(rows, xp, dp, m, c0 + rt * kRowsPerTile, co0, d, c_dy, ncols);
        } else {
          wg_tile_rows<true>(rows, xp, dp, m, c0 + rt * kRowsPerTile, co0, d, c_dy, ncols);
        }
      }
    }
  }
}
#endif

}  // namespace

std::int64_t fused_weight_grad_edge_block(std::int64_t c_x, std::int64_t c_dy) {
  // About 16 KiB of rows (x and dy) per block, half the 32 KiB L1d, so that the block's rows
  // stay in L1 while its tiles sweep them (each tile reads 6 of x's and 16 of dy's columns per
  // edge). Measured on kitti, 1 thread (docs/performance.md, "GEMM passes"): 64 KiB blocks (L2)
  // ran C=64 in 42 ms, 16 KiB in 28-30 ms; 8-24 KiB within noise of each other.
  const std::int64_t width = std::max<std::int64_t>(c_x + c_dy, 1);
  return std::clamp<std::int64_t>(4096 / width, 16, kMaxWeightGradBlock);
}

void fused_weight_grad_f32(const float* x, std::int64_t c_x, const std::int32_t* x_rows, const float* dy,
                           std::int64_t c_dy, const std::int32_t* dy_rows, std::int64_t n, std::int64_t c0,
                           std::int64_t c1, float* dw_rows) {
  LATTICE_ASSERT(cpu_has_avx_fma(), "fused_weight_grad_f32: called on a CPU without AVX + FMA");
  LATTICE_ASSERT(x_rows != nullptr && dy_rows != nullptr, "fused_weight_grad_f32: row lists are null");
#if LATTICE_FUSED_X86
  if (c1 > c0 && c_dy > 0) fused_weight_grad_fma(x, c_x, x_rows, dy, c_dy, dy_rows, n, c0, c1, dw_rows);
#else
  (void)x, (void)c_x, (void)dy, (void)c_dy, (void)n, (void)c0, (void)c1, (void)dw_rows;
#endif
}

bool fused_rows_available() { return g_enabled.load(std::memory_order_relaxed) && cpu_has_avx_fma(); }

void set_fused_rows_enabled(bool enabled) { g_enabled.store(enabled, std::memory_order_relaxed); }

std::int64_t packed_panels_size(std::int64_t c_src, std::int64_t c_dst) {
  return (c_dst + kPanelCols - 1) / kPanelCols * kPanelCols * c_src;
}

void pack_panels(const float* w, std::int64_t rsw, std::int64_t csw, std::int64_t c_src,
                 std::int64_t c_dst, float* out) {
  const std::int64_t panels = (c_dst + kPanelCols - 1) / kPanelCols;
  for (std::int64_t p = 0; p < panels; ++p) {
    float* panel = out + p * c_src * kPanelCols;
    for (std::int64_t ci = 0; ci < c_src; ++ci) {
      for (std::int64_t j = 0; j < kPanelCols; ++j) {
        const std::int64_t co = p * kPanelCols + j;
        panel[ci * kPanelCols + j] = co < c_dst ? w[ci * rsw + co * csw] : 0.0F;
      }
    }
  }
}

void fused_rows_f32(const float* src, std::int64_t c_src, const std::int32_t* src_rows,
                    const std::int32_t* dst_rows, std::int64_t r0, std::int64_t r1,
                    const float* packed_w, std::int64_t c_dst, float* acc) {
  LATTICE_ASSERT(cpu_has_avx_fma(), "fused_rows_f32: called on a CPU without AVX + FMA");
#if LATTICE_FUSED_X86
  if (r1 > r0 && c_dst > 0) fused_rows_fma(src, c_src, src_rows, dst_rows, r0, r1, packed_w, c_dst, acc);
#else
  (void)src, (void)c_src, (void)src_rows, (void)dst_rows, (void)r0, (void)r1, (void)packed_w, (void)c_dst, (void)acc;
#endif
}

void AlignedFloats::resize(std::int64_t count) {
  storage.resize(static_cast<std::size_t>(count) + 16);
  const auto addr = reinterpret_cast<std::uintptr_t>(storage.data());
  data = storage.data() + ((64 - addr % 64) % 64) / sizeof(float);
}

}  // namespace lattice::backend::cpu::detail
