// Fused gather-GEMM-scatter kernels for f32 (see fused_rows.h). The AVX2 + FMA code is compiled
// with a function-level target attribute and chosen at run time, so the library still runs on
// any x86-64 (and on other ISAs, where fused_rows_available() is false).
#include "backend/cpu/common/fused_rows.h"

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "lattice/core/error.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LATTICE_FUSED_X86 1
#include <immintrin.h>
#define LATTICE_AVX2_FMA __attribute__((target("avx2,fma")))
#else
#define LATTICE_FUSED_X86 0
#endif

namespace lattice::backend::cpu::detail {
namespace {

std::atomic<bool> g_enabled{true};

bool cpu_has_avx2_fma() {
#if LATTICE_FUSED_X86
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
#else
  return false;
#endif
}

#if LATTICE_FUSED_X86
// Rows of the next tile this far ahead are requested while the current tile runs (source rows
// 1-2 KB apart are cache misses the hardware prefetchers do not predict).
constexpr std::int64_t kRowsPerTile = 6;

LATTICE_AVX2_FMA inline void prefetch_row(const void* p, std::int64_t bytes, int for_write) {
  const char* c = static_cast<const char*>(p);
  for (std::int64_t off = 0; off < bytes; off += 64) {
    if (for_write) {
      __builtin_prefetch(c + off, 1, 3);
    } else {
      __builtin_prefetch(c + off, 0, 3);
    }
  }
}

// d[j] += (lo, hi)[j] for j < ncols (<= 16).
LATTICE_AVX2_FMA inline void add_row(float* d, __m256 lo, __m256 hi, std::int64_t ncols) {
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
LATTICE_AVX2_FMA inline void tile(const float* const* a, std::int64_t c_src, const float* bp,
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

LATTICE_AVX2_FMA void fused_rows_avx2(const float* src, std::int64_t c_src, const std::int32_t* src_rows,
                                      const std::int32_t* dst_rows, std::int64_t r0, std::int64_t r1,
                                      const float* packed_w, std::int64_t c_dst, float* acc) {
  const std::int64_t panels = (c_dst + kPanelCols - 1) / kPanelCols;
  const std::int64_t src_bytes = c_src * static_cast<std::int64_t>(sizeof(float));
  const std::int64_t dst_bytes = c_dst * static_cast<std::int64_t>(sizeof(float));
  for (std::int64_t g = r0; g < r1; g += kRowsPerTile) {
    const int rows = static_cast<int>(std::min(kRowsPerTile, r1 - g));
    // the next tile's rows, requested now
    for (std::int64_t r = g + kRowsPerTile; r < std::min(r1, g + 2 * kRowsPerTile); ++r) {
      prefetch_row(src + std::int64_t{src_rows[r]} * c_src, src_bytes, 0);
      prefetch_row(acc + std::int64_t{dst_rows[r]} * c_dst, dst_bytes, 1);
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
#endif

}  // namespace

bool fused_rows_available() { return g_enabled.load(std::memory_order_relaxed) && cpu_has_avx2_fma(); }

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
  LATTICE_ASSERT(cpu_has_avx2_fma(), "fused_rows_f32: called on a CPU without AVX2 + FMA");
#if LATTICE_FUSED_X86
  if (r1 > r0 && c_dst > 0) fused_rows_avx2(src, c_src, src_rows, dst_rows, r0, r1, packed_w, c_dst, acc);
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
