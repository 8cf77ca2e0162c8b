// Dense building blocks shared by the GEMM-based CPU routes (conv pointwise_matmul and
// gather_gemm_scatter, quantized fused_dequant_gemm). Private to src/backend/cpu/.
//
// Threading model: lattice owns every CPU thread it uses. GEMMs go through BLIS's typed API in
// its single-threaded build (libblis serial), called from inside lattice's own OpenMP regions
// on blocks of rows. So there is exactly one thread pool (libgomp, lattice::num_threads()
// threads) and no second pool to fight with: a multi-threaded BLAS (e.g. the pthread OpenBLAS
// that torch and numpy load into the same process) alternating with OpenMP regions made a
// k3 conv 10-20x slower on 2 cores, its idle threads spinning while the other pool needed the
// cores (measured 2026-11-30: kitti subm3 C=32 hot 29 ms with 1 thread, 532 ms with 2).
//
// Determinism: every output row is produced by one thread; the row blocking (kRowBlock) and
// the summation order over kernel offsets do not depend on the thread count, and a GEMM row's
// result does not depend on which other rows share its call. So results are bitwise identical
// for any thread count.
#pragma once

#include <blis.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "lattice/core/dtype.h"
#include "lattice/core/error.h"
#include "lattice/core/threads.h"

namespace lattice::backend::cpu::detail {

// Rows per GEMM call: a 256 x 128 f32 block is 128 KiB, which stays in L2 (>= 512 KiB on the
// machines we target) together with W[k]; large enough that BLIS's micro-kernels run at speed.
inline constexpr std::int64_t kRowBlock = 256;

// Work below this many multiply-adds (or copied elements) runs on one thread: an OpenMP fork/join
// costs a few microseconds. Estimate, not benchmarked yet (2026-11).
inline constexpr std::int64_t kParallelMinWork = std::int64_t{1} << 16;

inline int threads_for(std::int64_t work) {
  return work < kParallelMinWork ? 1 : lattice::num_threads();
}

// True when T is its own accumulation type (f32, f64): outputs can then be accumulated in place
// and inputs used without conversion.
template <class T>
inline constexpr bool kStorageIsAccum = std::is_same_v<T, Accum<T>>;

// One thread: C(m, n) = A(m, k) @ B(k, n) + beta * C, every operand given by a pointer and its
// row and column strides (so transposes are stride swaps). A = float or double.
template <class A>
void gemm(std::int64_t m, std::int64_t n, std::int64_t k, const A* a, std::int64_t rsa,
          std::int64_t csa, const A* b, std::int64_t rsb, std::int64_t csb, A beta, A* c,
          std::int64_t rsc, std::int64_t csc) {
  static_assert(std::is_same_v<A, float> || std::is_same_v<A, double>);
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (std::int64_t r = 0; r < m; ++r)
      for (std::int64_t j = 0; j < n; ++j) {
        A& v = c[r * rsc + j * csc];
        v = beta == A{0} ? A{0} : beta * v;
      }
    return;
  }
  A alpha{1};
  if constexpr (std::is_same_v<A, float>) {
    bli_sgemm(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, m, n, k, &alpha, const_cast<A*>(a), rsa, csa,
              const_cast<A*>(b), rsb, csb, &beta, c, rsc, csc);
  } else {
    bli_dgemm(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, m, n, k, &alpha, const_cast<A*>(a), rsa, csa,
              const_cast<A*>(b), rsb, csb, &beta, c, rsc, csc);
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

// w (K, c_in, c_out) of storage type T into `out` (K, c_out, c_in) in Accum<T>: every W[k]
// transposed into contiguous rows (exact: a copy, widened for f16/bf16).
template <class T>
void transpose_weights(const T* w, std::int64_t K, std::int64_t c_in, std::int64_t c_out,
                       std::vector<Accum<T>>& out) {
  out.resize(static_cast<std::size_t>(K * c_in * c_out));
  Accum<T>* dst = out.data();
  for (std::int64_t k = 0; k < K; ++k) {
    const T* src = w + k * c_in * c_out;
    Accum<T>* d = dst + k * c_in * c_out;
    for (std::int64_t ci = 0; ci < c_in; ++ci)
      for (std::int64_t co = 0; co < c_out; ++co) d[co * c_in + ci] = load(src[ci * c_out + co]);
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

// True when rows[0, m) are consecutive row numbers (rows[j] == rows[0] + j): a block that can
// be read or written in place, without a gathered copy.
inline bool consecutive(const std::int32_t* rows, std::int64_t m) {
  if (m <= 0) return false;
  if (std::int64_t{rows[m - 1]} - rows[0] != m - 1) return false;
  for (std::int64_t j = 1; j < m; ++j) {
    if (rows[j] != rows[j - 1] + 1) return false;
  }
  return true;
}

// Gathered and scattered rows lie 1-2 KB apart in a 10-30 MB feature matrix (a relation's rows of
// one offset): the hardware prefetchers do not follow them and every row is an L2/L3 miss that
// the copy loops wait for (perf, kitti C=32, issue 17: the copies took as long as the GEMMs).
// Rows this far ahead are requested while the current one is copied.
inline constexpr std::int64_t kPrefetchRows = 8;

// Requests every cache line of a row of `bytes` bytes at `p` (a hint: no effect on results).
inline void prefetch_row(const void* p, std::int64_t bytes, bool for_write = false) {
  const char* c = static_cast<const char*>(p);
  for (std::int64_t off = 0; off < bytes; off += 64) {
    if (for_write) {
      __builtin_prefetch(c + off, 1, 3);
    } else {
      __builtin_prefetch(c + off, 0, 3);
    }
  }
}

// Per-thread scratch of the blocked kernels.
template <class A>
struct Scratch {
  std::vector<A> src;  // (kRowBlock, c_src) gathered rows
  std::vector<A> dst;  // (kRowBlock, c_dst) GEMM product
};

// One row block of a gather-GEMM-scatter, run by the calling thread:
//   acc[dst_rows[r], :] += src[src_rows[r], :] @ W   for r in [r0, r1)
// src is (*, c_src) of storage type T; W is (c_src, c_dst) in Accum<T> with strides (rsw, csw);
// acc is (*, c_dst). Null src_rows / dst_rows mean the identity (row r).
// Precondition: dst_rows are distinct within the block's offset (no two threads touch a row).
template <class T>
void gemm_rows(const T* src, std::int64_t c_src, const std::int32_t* src_rows,
               const std::int32_t* dst_rows, std::int64_t r0, std::int64_t r1, const Accum<T>* w,
               std::int64_t rsw, std::int64_t csw, std::int64_t c_dst, Accum<T>* acc,
               Scratch<Accum<T>>& s) {
  using A = Accum<T>;
  const std::int64_t m = r1 - r0;
  if (m <= 0) return;
  const A* a = nullptr;
  if constexpr (kStorageIsAccum<T>) {
    // Consecutive source and destination rows (the centre offset of a submanifold kernel, whose
    // edges are (o, o), or any run of them): multiply in place, no gather, no scatter. For
    // c_src up to BLIS's inner panel depth this is the gathered path's one add of the product
    // per element; deeper products are added panel by panel (other rounding, equally fixed:
    // the choice depends on the row numbers only).
    if (src_rows != nullptr && dst_rows != nullptr && consecutive(src_rows + r0, m) &&
        consecutive(dst_rows + r0, m)) {
      gemm<A>(m, c_dst, c_src, reinterpret_cast<const A*>(src) + std::int64_t{src_rows[r0]} * c_src, c_src, 1, w,
              rsw, csw, A{1}, acc + std::int64_t{dst_rows[r0]} * c_dst, c_dst, 1);
      return;
    }
  }
  if (src_rows == nullptr && kStorageIsAccum<T>) {
    a = reinterpret_cast<const A*>(src) + r0 * c_src;
  } else {
    s.src.resize(static_cast<std::size_t>(kRowBlock * c_src));
    for (std::int64_t r = 0; r < m; ++r) {
      if (src_rows != nullptr && r + kPrefetchRows < m)
        prefetch_row(src + std::int64_t{src_rows[r0 + r + kPrefetchRows]} * c_src,
                     c_src * static_cast<std::int64_t>(sizeof(T)));
      const std::int64_t row = src_rows ? std::int64_t{src_rows[r0 + r]} : r0 + r;
      const T* from = src + row * c_src;
      A* to = s.src.data() + r * c_src;
      for (std::int64_t j = 0; j < c_src; ++j) to[j] = load(from[j]);
    }
    a = s.src.data();
  }
  if (dst_rows == nullptr) {  // rows are contiguous in acc: accumulate in place
    gemm<A>(m, c_dst, c_src, a, c_src, 1, w, rsw, csw, A{1}, acc + r0 * c_dst, c_dst, 1);
    return;
  }
  s.dst.resize(static_cast<std::size_t>(kRowBlock * c_dst));
  gemm<A>(m, c_dst, c_src, a, c_src, 1, w, rsw, csw, A{0}, s.dst.data(), c_dst, 1);
  for (std::int64_t r = 0; r < std::min(m, kPrefetchRows); ++r)
    prefetch_row(acc + std::int64_t{dst_rows[r0 + r]} * c_dst, c_dst * static_cast<std::int64_t>(sizeof(A)), true);
  for (std::int64_t r = 0; r < m; ++r) {
    if (r + kPrefetchRows < m)
      prefetch_row(acc + std::int64_t{dst_rows[r0 + r + kPrefetchRows]} * c_dst,
                   c_dst * static_cast<std::int64_t>(sizeof(A)), true);
    const A* from = s.dst.data() + r * c_dst;
    A* to = acc + std::int64_t{dst_rows[r0 + r]} * c_dst;
    for (std::int64_t j = 0; j < c_dst; ++j) to[j] += from[j];
  }
}

// Edges per weight-gradient GEMM (its inner dimension): kRowBlock for C >= 128, longer for
// narrow channels so that a call does enough work to amortise BLIS's per-call packing and set-up
// (a 32 x 32 x 256 call is 0.5 MFLOP); the gathered blocks stay <= 256 KiB. Depends only on the
// channel counts, so the summation order is the same for any thread count.
inline std::int64_t weight_grad_edge_block(std::int64_t c_x, std::int64_t c_dy) {
  const std::int64_t width = std::max<std::int64_t>(c_x + c_dy, 1);
  // a multiple of kRowBlock (BLIS's inner panel depth): a 341-edge block ran as 256 + 85.
  const auto blocks = static_cast<std::uint64_t>(std::max<std::int64_t>((std::int64_t{1} << 16) / width / kRowBlock, 1));
  return kRowBlock * static_cast<std::int64_t>(std::min<std::uint64_t>(std::bit_floor(blocks), 8));
}

// dW(c_x, c_dy) (+)= gather(x)^T @ gather(dy) over edge rows [0, n), columns [c0, c1) of x only,
// accumulated block by block in a fixed order (deterministic). x rows via x_rows, dy rows via
// dy_rows (null = identity). dw_rows points at row c0 of the (c_x, c_dy) accumulator.
template <class T>
void weight_grad_rows(const T* x, std::int64_t c_x, const std::int32_t* x_rows, const T* dy,
                      std::int64_t c_dy, const std::int32_t* dy_rows, std::int64_t n,
                      std::int64_t c0, std::int64_t c1, Accum<T>* dw_rows, Scratch<Accum<T>>& s) {
  using A = Accum<T>;
  const std::int64_t cw = c1 - c0;
  if (x_rows == nullptr && dy_rows == nullptr && kStorageIsAccum<T>) {
    // contiguous rows (pointwise on the identity relation): one GEMM straight from the
    // features, x read transposed through its strides, no gathered copies.
    gemm<A>(cw, c_dy, n, reinterpret_cast<const A*>(x) + c0, 1, c_x, reinterpret_cast<const A*>(dy),
            c_dy, 1, A{0}, dw_rows, c_dy, 1);
    return;
  }
  const std::int64_t block = weight_grad_edge_block(cw, c_dy);
  s.src.resize(static_cast<std::size_t>(block * cw));
  s.dst.resize(static_cast<std::size_t>(block * c_dy));
  std::fill_n(dw_rows, cw * c_dy, A{0});
  for (std::int64_t r0 = 0; r0 < n; r0 += block) {
    const std::int64_t m = std::min(block, n - r0);
    if constexpr (kStorageIsAccum<T>) {
      if (x_rows != nullptr && dy_rows != nullptr && consecutive(x_rows + r0, m) && consecutive(dy_rows + r0, m)) {
        // consecutive rows on both sides (a submanifold kernel's centre): read them in place
        gemm<A>(cw, c_dy, m, reinterpret_cast<const A*>(x) + std::int64_t{x_rows[r0]} * c_x + c0, 1, c_x,
                reinterpret_cast<const A*>(dy) + std::int64_t{dy_rows[r0]} * c_dy, c_dy, 1, A{1}, dw_rows, c_dy, 1);
        continue;
      }
    }
    for (std::int64_t r = 0; r < m; ++r) {
      if (r + kPrefetchRows < m) {
        if (x_rows != nullptr)
          prefetch_row(x + std::int64_t{x_rows[r0 + r + kPrefetchRows]} * c_x + c0, cw * static_cast<std::int64_t>(sizeof(T)));
        if (dy_rows != nullptr)
          prefetch_row(dy + std::int64_t{dy_rows[r0 + r + kPrefetchRows]} * c_dy, c_dy * static_cast<std::int64_t>(sizeof(T)));
      }
      const std::int64_t xr = x_rows ? std::int64_t{x_rows[r0 + r]} : r0 + r;
      const std::int64_t dr = dy_rows ? std::int64_t{dy_rows[r0 + r]} : r0 + r;
      const T* xf = x + xr * c_x + c0;
      const T* df = dy + dr * c_dy;
      A* xt = s.src.data() + r * cw;
      A* dt = s.dst.data() + r * c_dy;
      for (std::int64_t j = 0; j < cw; ++j) xt[j] = load(xf[j]);
      for (std::int64_t j = 0; j < c_dy; ++j) dt[j] = load(df[j]);
    }
    // (cw, m) @ (m, c_dy): the gathered x block read transposed (row stride 1, column stride cw).
    gemm<A>(cw, c_dy, m, s.src.data(), 1, cw, s.dst.data(), c_dy, 1, A{1}, dw_rows, c_dy, 1);
  }
}

// Splits C_in of a weight gradient into column blocks so that a kernel with few offsets (1x1x1
// has one) still yields several work items. Depends only on the problem, never on the thread
// count, so the result is the same for any number of threads.
inline std::int64_t weight_grad_column_block(std::int64_t kernel_volume, std::int64_t c_in) {
  constexpr std::int64_t kMinItems = 8;  // enough items for 8 threads
  if (kernel_volume >= kMinItems || c_in <= 16) return std::max<std::int64_t>(c_in, 1);
  const std::int64_t blocks = (kMinItems + kernel_volume - 1) / kernel_volume;
  return std::max<std::int64_t>(16, (c_in + blocks - 1) / blocks);
}

}  // namespace lattice::backend::cpu::detail
