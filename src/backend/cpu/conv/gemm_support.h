// Dense building blocks shared by the GEMM-based CPU conv routes (pointwise_matmul,
// gather_gemm_scatter): a row-major BLAS GEMM in the accumulation type, row gathers and
// scatters, and the one conversion to / from the storage dtype. Private to
// src/backend/cpu/conv/; included only by route .cpp files (it pulls in <cblas.h>).
//
// Every loop here is data-parallel over rows or elements with no reductions, so results do not
// depend on the thread count; the OpenMP loops use lattice::num_threads() threads (the BLAS
// library keeps its own thread setting).
#pragma once

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "lattice/core/dtype.h"
#include "lattice/core/error.h"
#include "lattice/core/threads.h"

namespace lattice::backend::cpu::detail {

// Loops over fewer elements than this run on one thread: an OpenMP fork/join costs a few
// microseconds, about the time to copy this many elements. Estimate; not benchmarked yet (the
// shared 2-core dev box was too loaded to measure, 2026-11).
inline constexpr std::int64_t kParallelMinElements = std::int64_t{1} << 15;

// Threads for a loop touching `elements` elements: 1 below kParallelMinElements, else
// lattice::num_threads().
inline int threads_for(std::int64_t elements) {
  return elements < kParallelMinElements ? 1 : lattice::num_threads();
}

// True when T is its own accumulation type (f32, f64): outputs can then be accumulated in place
// and inputs used without conversion.
template <class T>
inline constexpr bool kStorageIsAccum = std::is_same_v<T, Accum<T>>;

inline int blas_int(std::int64_t v) {
  LATTICE_ASSERT(v >= 0 && v <= INT_MAX, "GEMM dimension exceeds the BLAS int range");
  return static_cast<int>(v);
}

// C(m, n) = op(A) @ op(B) + beta * C, all row-major; op(A) is (m, k), op(B) is (k, n), and a set
// trans flag means the matrix is stored transposed. A = f32 (sgemm) or f64 (dgemm).
// Empty products are handled here (BLAS rejects leading dimensions of 0).
template <class A>
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const A* a,
          std::int64_t lda, const A* b, std::int64_t ldb, A beta, A* c, std::int64_t ldc) {
  static_assert(std::is_same_v<A, float> || std::is_same_v<A, double>);
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (beta == A{0}) {
      for (std::int64_t r = 0; r < m; ++r) std::fill_n(c + r * ldc, n, A{0});
    }
    return;
  }
  const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<A, float>) {
    cblas_sgemm(CblasRowMajor, ta, tb, blas_int(m), blas_int(n), blas_int(k), 1.0f, a,
                blas_int(lda), b, blas_int(ldb), beta, c, blas_int(ldc));
  } else {
    cblas_dgemm(CblasRowMajor, ta, tb, blas_int(m), blas_int(n), blas_int(k), 1.0, a, blas_int(lda),
                b, blas_int(ldb), beta, c, blas_int(ldc));
  }
}

// `src` (count elements) in the accumulation type: `src` itself for f32/f64, otherwise a
// converted copy held in `storage`.
template <class T>
const Accum<T>* as_accum(const T* src, std::int64_t count, std::vector<Accum<T>>& storage) {
  if constexpr (kStorageIsAccum<T>) {
    return src;
  } else {
    storage.resize(static_cast<std::size_t>(count));
    Accum<T>* dst = storage.data();
    const int threads = threads_for(count);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (std::int64_t j = 0; j < count; ++j) dst[j] = load(src[j]);
    return dst;
  }
}

// Where an output of `count` elements accumulates: the output itself for f32/f64, otherwise
// `storage` (rounded into the output later by store_all).
template <class T>
Accum<T>* accum_target(T* out, std::int64_t count, std::vector<Accum<T>>& storage) {
  if constexpr (kStorageIsAccum<T>) {
    return out;
  } else {
    storage.resize(static_cast<std::size_t>(count));
    return storage.data();
  }
}

// out = round(acc) elementwise; a no-op when the accumulator is the output itself.
template <class T>
void store_all(const Accum<T>* acc, std::int64_t count, T* out) {
  if constexpr (!kStorageIsAccum<T>) {
    const int threads = threads_for(count);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (std::int64_t j = 0; j < count; ++j) out[j] = store<T>(acc[j]);
  }
}

// Every row of dst (rows, cols) = bias (cols), or 0 when bias is null.
template <class T>
void fill_rows(Accum<T>* dst, std::int64_t rows, std::int64_t cols, const T* bias) {
  const int threads = threads_for(rows * cols);
#pragma omp parallel for schedule(static) num_threads(threads)
  for (std::int64_t r = 0; r < rows; ++r) {
    Accum<T>* d = dst + r * cols;
    for (std::int64_t j = 0; j < cols; ++j) d[j] = bias ? load(bias[j]) : Accum<T>{0};
  }
}

// dst[r, :] = src[rows[r], :] in the accumulation type, for r < n; src is (*, cols), dst (n, cols).
template <class T>
void gather_rows(const T* src, std::int64_t cols, const std::int32_t* rows, std::int64_t n,
                 Accum<T>* dst) {
  const int threads = threads_for(n * cols);
#pragma omp parallel for schedule(static) num_threads(threads)
  for (std::int64_t r = 0; r < n; ++r) {
    const T* s = src + std::int64_t{rows[r]} * cols;
    Accum<T>* d = dst + r * cols;
    for (std::int64_t j = 0; j < cols; ++j) d[j] = load(s[j]);
  }
}

// acc[rows[r], :] += src[r, :] for r < n. Precondition: rows[0..n) are distinct, so rows are
// updated by one thread each (no races, no atomics).
template <class A>
void scatter_add_rows(const A* src, std::int64_t cols, const std::int32_t* rows, std::int64_t n,
                      A* acc) {
  const int threads = threads_for(n * cols);
#pragma omp parallel for schedule(static) num_threads(threads)
  for (std::int64_t r = 0; r < n; ++r) {
    const A* s = src + r * cols;
    A* d = acc + std::int64_t{rows[r]} * cols;
    for (std::int64_t j = 0; j < cols; ++j) d[j] += s[j];
  }
}

}  // namespace lattice::backend::cpu::detail
