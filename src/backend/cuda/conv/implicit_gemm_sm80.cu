// Constraints: CUDA device of tier tensor_core or above (sm_80+); f16 or bf16, or f32 only with
// allow_tf32 (tf32 tensor cores); any relation kind, any kernel volume, any edge count, any
// channel counts (tiles are guarded, no multiple-of-8 requirement). Deterministic:
// bitwise-identical results for the same inputs, device and build (no atomics).
//
// Tensor-core implicit GEMM (nvcuda::wmma mma.sync, f32 accumulation). A thread block of four
// warps owns an output tile of 64 destination rows x 64 destination channels and walks the
// kernel offsets k in order; for each offset it reads the tile's column k of the map
// (destination row -> source row or -1) and skips the offset when no row of the tile has it;
// otherwise it loops over the source channels in steps of 32: A = the gathered source rows
// (-1 -> zeros), B = the matching 32 x 64 slice of W[k] (or W[k]^T), one mma per 16 x 16 piece.
//   forward     map = the relation's N_out x K gemm_map (built on the device when the view has
//               none); source x, destination y, B = W[k] (C_in, C_out); bias added at the end.
//   input_grad  map = the input-side (n_in, K) map of output rows, built on the device from the
//               edges (a scatter with unique (i, k) slots, so deterministic); source dy,
//               destination dx, B = W[k]^T (C_out, C_in).
//   weight_grad dW[k] (C_in, C_out) = sum over output rows o with map[o, k] >= 0 of
//               x[map[o, k]]^T dy[o]: split-K over fixed chunks of output rows (a data-only
//               rule); each block (offset, chunk, 64 x 64 tile of dW[k]) writes its f32 partial
//               to a buffer, and a second kernel adds the chunks in ascending order.
// Each output element is rounded to the storage dtype once, at the end.
//
// Shapes (K = kernel volume): x (n_in, C_in), w (K, C_in, C_out), bias (C_out) or null,
//   y (n_out, C_out), dy (n_out, C_out), dx (n_in, C_in), dw (K, C_in, C_out).
//   Buffers: the maps (int32), weight-gradient partials (chunks, K, C_in, C_out) f32.
// The kernels are plain (no cp.async pipeline yet); speed comes in a later issue.
#include <mma.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/common/conv_support.cuh"
#include "backend/cuda/conv/conv_routes.h"
#include "backend/cuda/runtime/check.h"
#include "backend/cuda/runtime/stream.h"
#include "lattice/core/error.h"

namespace lattice::backend::cuda {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kBM = 64;        // tile rows (destination rows; weight_grad: C_in)
constexpr int kBN = 64;        // tile columns (destination channels; weight_grad: C_out)
constexpr int kBK = 32;        // reduction step (source channels; weight_grad: output rows)
constexpr int kThreads = 128;  // four warps, each a 32 x 32 quarter of the tile (2 x 2 mma pieces)

// mma shape and fragment element type per storage type.
template <class E> struct MmaOf;
template <> struct MmaOf<__half> {
  static constexpr int K = 16;
  using frag = __half;
};
template <> struct MmaOf<__nv_bfloat16> {
  static constexpr int K = 16;
  using frag = __nv_bfloat16;
};
template <> struct MmaOf<float> {
  static constexpr int K = 8;
  using frag = wmma::precision::tf32;
};

// Shared-memory row padding: 16 bytes, keeping every fragment pointer 32-byte aligned.
template <class E> constexpr int kPad = 16 / static_cast<int>(sizeof(E));
constexpr int kCPad = 4;

template <class E, class Frag>
__device__ __forceinline__ void to_tf32_if_needed(Frag& f) {
  if constexpr (std::is_same_v<E, float>) {
#pragma unroll
    for (int t = 0; t < f.num_elements; ++t) f.x[t] = wmma::__float_to_tf32(f.x[t]);
  }
}

// dst (n_dst, c_dst) = round(bias + sum_k gather_{map[:, k]}(src) @ B_k), with
// B_k(r, c) = w[k * c_src * c_dst + r * w_rs + c * w_cs] (r < c_src, c < c_dst).
template <class E>
__global__ void __launch_bounds__(kThreads)
    implicit_gemm_kernel(const std::int32_t* __restrict__ map, std::int64_t n_dst, std::int64_t kernel_volume,
                         const E* __restrict__ src, std::int64_t c_src, const E* __restrict__ w, std::int64_t w_rs,
                         std::int64_t w_cs, std::int64_t c_dst, const E* __restrict__ bias, E* __restrict__ dst) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using M = MmaOf<E>;
  constexpr int lda = kBK + kPad<E>;
  constexpr int ldb = kBN + kPad<E>;
  constexpr int ldc = kBN + kCPad;
  __shared__ __align__(128) E as[kBM * lda];
  __shared__ __align__(128) E bs[kBK * ldb];
  __shared__ __align__(128) float cs[kBM * ldc];
  __shared__ std::int32_t rows[kBM];

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int wr = warp / 2, wc = warp % 2;
  const std::int64_t row0 = static_cast<std::int64_t>(blockIdx.x) * kBM;
  const std::int64_t col0 = static_cast<std::int64_t>(blockIdx.y) * kBN;
  const std::int64_t per_offset = c_src * c_dst;
  const E zero = from_f32<E>(0.0f);
  const bool w_rows_contiguous = w_cs != 1;  // input_grad: B's rows are contiguous in w

  wmma::fragment<wmma::accumulator, 16, 16, M::K, float> acc[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

  for (std::int64_t k = 0; k < kernel_volume; ++k) {
    int has = 0;
    if (tid < kBM) {
      const std::int64_t r = row0 + tid;
      const std::int32_t v = r < n_dst ? map[r * kernel_volume + k] : -1;
      rows[tid] = v;
      has = v >= 0;
    }
    if (!__syncthreads_or(has)) continue;  // no row of the tile has offset k
    const E* wk = w + k * per_offset;
    for (std::int64_t c0 = 0; c0 < c_src; c0 += kBK) {
      for (int idx = tid; idx < kBM * kBK; idx += kThreads) {
        const int r = idx / kBK, c = idx % kBK;
        const std::int32_t v = rows[r];
        const std::int64_t ch = c0 + c;
        as[r * lda + c] = (v >= 0 && ch < c_src) ? src[static_cast<std::int64_t>(v) * c_src + ch] : zero;
      }
      for (int idx = tid; idx < kBK * kBN; idx += kThreads) {
        // Consecutive threads walk the contiguous direction of w (coalesced reads).
        const int r = w_rows_contiguous ? idx % kBK : idx / kBN;
        const int c = w_rows_contiguous ? idx / kBK : idx % kBN;
        const std::int64_t ch = c0 + r, co = col0 + c;
        bs[r * ldb + c] = (ch < c_src && co < c_dst) ? wk[ch * w_rs + co * w_cs] : zero;
      }
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < kBK; kk += M::K) {
        wmma::fragment<wmma::matrix_a, 16, 16, M::K, typename M::frag, wmma::row_major> fa[2];
        wmma::fragment<wmma::matrix_b, 16, 16, M::K, typename M::frag, wmma::row_major> fb[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          wmma::load_matrix_sync(fa[i], as + (wr * 32 + i * 16) * lda + kk, lda);
          to_tf32_if_needed<E>(fa[i]);
        }
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          wmma::load_matrix_sync(fb[j], bs + kk * ldb + wc * 32 + j * 16, ldb);
          to_tf32_if_needed<E>(fb[j]);
        }
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
      }
      __syncthreads();
    }
  }

#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(cs + (wr * 32 + i * 16) * ldc + wc * 32 + j * 16, acc[i][j], ldc, wmma::mem_row_major);
  __syncthreads();
  for (int idx = tid; idx < kBM * kBN; idx += kThreads) {
    const int r = idx / kBN, c = idx % kBN;
    const std::int64_t row = row0 + r, co = col0 + c;
    if (row < n_dst && co < c_dst) {
      float v = cs[r * ldc + c];
      if (bias) v += to_f32(bias[co]);
      dst[row * c_dst + co] = from_f32<E>(v);
    }
  }
#else
  __trap();  // built for an architecture without these mma shapes; admission requires sm_80+
#endif
}

// partial[chunk][k] (C_in, C_out) = sum over output rows o of the chunk with map[o, k] >= 0 of
// x[map[o, k]]^T dy[o]. blockIdx.x = k * chunks + chunk, blockIdx.y = C_out tile, blockIdx.z =
// C_in tile.
template <class E>
__global__ void __launch_bounds__(kThreads)
    weight_grad_kernel(const std::int32_t* __restrict__ map, std::int64_t n_out, std::int64_t kernel_volume,
                       const E* __restrict__ x, std::int64_t c_in, const E* __restrict__ dy, std::int64_t c_out,
                       std::int64_t rows_per_chunk, std::int64_t chunks, float* __restrict__ partial) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using M = MmaOf<E>;
  constexpr int lda = kBM + kPad<E>;  // a stored as (reduction row, C_in): col-major A
  constexpr int ldb = kBN + kPad<E>;
  constexpr int ldc = kBN + kCPad;
  __shared__ __align__(128) E as[kBK * lda];
  __shared__ __align__(128) E bs[kBK * ldb];
  __shared__ __align__(128) float cs[kBM * ldc];
  __shared__ std::int32_t rows[kBK];

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int wr = warp / 2, wc = warp % 2;
  const std::int64_t k = blockIdx.x / chunks;
  const std::int64_t chunk = blockIdx.x % chunks;
  const std::int64_t co0 = static_cast<std::int64_t>(blockIdx.y) * kBN;
  const std::int64_t ci0 = static_cast<std::int64_t>(blockIdx.z) * kBM;
  const std::int64_t r_begin = chunk * rows_per_chunk;
  const std::int64_t r_end = r_begin + rows_per_chunk < n_out ? r_begin + rows_per_chunk : n_out;
  const E zero = from_f32<E>(0.0f);

  wmma::fragment<wmma::accumulator, 16, 16, M::K, float> acc[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

  for (std::int64_t rb = r_begin; rb < r_end; rb += kBK) {
    int has = 0;
    if (tid < kBK) {
      const std::int64_t r = rb + tid;
      const std::int32_t v = r < r_end ? map[r * kernel_volume + k] : -1;
      rows[tid] = v;
      has = v >= 0;
    }
    if (!__syncthreads_or(has)) continue;  // no row of this step has offset k
    for (int idx = tid; idx < kBK * kBM; idx += kThreads) {
      const int r = idx / kBM, c = idx % kBM;
      const std::int32_t v = rows[r];
      const std::int64_t ci = ci0 + c;
      as[r * lda + c] = (v >= 0 && ci < c_in) ? x[static_cast<std::int64_t>(v) * c_in + ci] : zero;
    }
    for (int idx = tid; idx < kBK * kBN; idx += kThreads) {
      const int r = idx / kBN, c = idx % kBN;
      const std::int64_t co = co0 + c;
      bs[r * ldb + c] = (rows[r] >= 0 && co < c_out) ? dy[(rb + r) * c_out + co] : zero;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kBK; kk += M::K) {
      wmma::fragment<wmma::matrix_a, 16, 16, M::K, typename M::frag, wmma::col_major> fa[2];
      wmma::fragment<wmma::matrix_b, 16, 16, M::K, typename M::frag, wmma::row_major> fb[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        wmma::load_matrix_sync(fa[i], as + kk * lda + wr * 32 + i * 16, lda);
        to_tf32_if_needed<E>(fa[i]);
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        wmma::load_matrix_sync(fb[j], bs + kk * ldb + wc * 32 + j * 16, ldb);
        to_tf32_if_needed<E>(fb[j]);
      }
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(cs + (wr * 32 + i * 16) * ldc + wc * 32 + j * 16, acc[i][j], ldc, wmma::mem_row_major);
  __syncthreads();
  float* out = partial + (chunk * kernel_volume + k) * c_in * c_out;
  for (int idx = tid; idx < kBM * kBN; idx += kThreads) {
    const int r = idx / kBN, c = idx % kBN;
    const std::int64_t ci = ci0 + r, co = co0 + c;
    if (ci < c_in && co < c_out) out[ci * c_out + co] = cs[r * ldc + c];
  }
#else
  __trap();  // built for an architecture without these mma shapes; admission requires sm_80+
#endif
}

// dw[j] = round(sum over chunks c ascending of partial[c * n + j]).
template <class E>
__global__ void reduce_chunks(const float* __restrict__ partial, std::int64_t chunks, std::int64_t n, E* __restrict__ dw) {
  for (std::int64_t j = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; j < n;
       j += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    float t = partial[j];
    for (std::int64_t c = 1; c < chunks; ++c) t += partial[c * n + j];
    dw[j] = from_f32<E>(t);
  }
}

std::int64_t tiles(std::int64_t n, std::int64_t tile) { return (n + tile - 1) / tile; }

void check_grid(std::int64_t rows_tiles, std::int64_t col_tiles) {
  LATTICE_ASSERT(rows_tiles <= 2147483647 && col_tiles <= 65535,
                 "conv implicit_gemm_sm80: problem too large for the grid");
}

void check_edges(const RelationView& rel) {
  LATTICE_ASSERT(rel.n_edges == 0 || (rel.in_idx && rel.out_idx && rel.k_idx),
                 "conv implicit_gemm_sm80: edge list (in_idx, out_idx, k_idx) is null");
}

template <class E>
void forward(const ConvArgs& a) {
  const RelationView& rel = a.rel;
  check_edges(rel);
  if (rel.n_out == 0 || a.c_out == 0) return;
  DeviceGuard guard(a.device.index);
  cudaStream_t s = stream_of(a.device);
  Array built;
  const std::int32_t* map = rel.gemm_map;
  if (!map) {
    built = build_edge_map(rel.out_idx, rel.in_idx, rel.k_idx, rel.n_edges, rel.n_out, rel.kernel_volume, a.device);
    map = built.data<std::int32_t>();
  }
  const std::int64_t rt = tiles(rel.n_out, kBM), ct = tiles(a.c_out, kBN);
  check_grid(rt, ct);
  implicit_gemm_kernel<E><<<dim3(static_cast<unsigned>(rt), static_cast<unsigned>(ct)), kThreads, 0, s>>>(
      map, rel.n_out, rel.kernel_volume, static_cast<const E*>(a.x), a.c_in, static_cast<const E*>(a.w), a.c_out, 1,
      a.c_out, static_cast<const E*>(a.bias), static_cast<E*>(a.y));
  LATTICE_CUDA_CHECK_LAUNCH();
}

template <class E>
void input_grad(const ConvArgs& a) {
  const RelationView& rel = a.rel;
  check_edges(rel);
  if (rel.n_in == 0 || a.c_in == 0) return;
  DeviceGuard guard(a.device.index);
  cudaStream_t s = stream_of(a.device);
  if (rel.n_edges == 0 || a.c_out == 0) {
    LATTICE_CUDA_CHECK(cudaMemsetAsync(a.dx, 0, static_cast<std::size_t>(rel.n_in * a.c_in) * sizeof(E), s));
    return;
  }
  // (n_in, K) map of output rows: input i reaches output map[i, k] through offset k.
  const Array map = build_edge_map(rel.in_idx, rel.out_idx, rel.k_idx, rel.n_edges, rel.n_in, rel.kernel_volume,
                                   a.device);
  const std::int64_t rt = tiles(rel.n_in, kBM), ct = tiles(a.c_in, kBN);
  check_grid(rt, ct);
  // B_k = W[k]^T: B(r = co, c = ci) = w[k][ci * C_out + co].
  implicit_gemm_kernel<E><<<dim3(static_cast<unsigned>(rt), static_cast<unsigned>(ct)), kThreads, 0, s>>>(
      map.data<std::int32_t>(), rel.n_in, rel.kernel_volume, static_cast<const E*>(a.dy), a.c_out,
      static_cast<const E*>(a.w), 1, a.c_out, a.c_in, nullptr, static_cast<E*>(a.dx));
  LATTICE_CUDA_CHECK_LAUNCH();
}

template <class E>
void weight_grad(const ConvArgs& a) {
  const RelationView& rel = a.rel;
  check_edges(rel);
  const std::int64_t per_offset = a.c_in * a.c_out;
  const std::int64_t n = rel.kernel_volume * per_offset;
  if (n == 0) return;
  DeviceGuard guard(a.device.index);
  cudaStream_t s = stream_of(a.device);
  if (rel.n_edges == 0 || rel.n_out == 0) {
    LATTICE_CUDA_CHECK(cudaMemsetAsync(a.dw, 0, static_cast<std::size_t>(n) * sizeof(E), s));
    return;
  }
  Array built;
  const std::int32_t* map = rel.gemm_map;
  if (!map) {
    built = build_edge_map(rel.out_idx, rel.in_idx, rel.k_idx, rel.n_edges, rel.n_out, rel.kernel_volume, a.device);
    map = built.data<std::int32_t>();
  }
  // Split-K over output rows: a data-only rule (same chunks on every run and device). At most
  // 32 chunks, at least 2048 rows each, and partials capped near 256 MiB.
  std::int64_t chunks = std::min<std::int64_t>(32, std::max<std::int64_t>(1, rel.n_out / 2048));
  const std::int64_t cap = std::max<std::int64_t>(1, (std::int64_t{256} << 20) / (n * 4));
  chunks = std::min(chunks, cap);
  std::int64_t rows_per_chunk = tiles(rel.n_out, chunks);
  rows_per_chunk = tiles(rows_per_chunk, kBK) * kBK;
  chunks = tiles(rel.n_out, rows_per_chunk);
  const std::int64_t ci_t = tiles(a.c_in, kBM), co_t = tiles(a.c_out, kBN);
  LATTICE_ASSERT(rel.kernel_volume * chunks <= 2147483647 && co_t <= 65535 && ci_t <= 65535,
                 "conv implicit_gemm_sm80 weight_grad: problem too large for the grid");
  Array partial = Array::empty({chunks, rel.kernel_volume, a.c_in, a.c_out}, Dtype::f32, a.device);
  const dim3 grid(static_cast<unsigned>(rel.kernel_volume * chunks), static_cast<unsigned>(co_t),
                  static_cast<unsigned>(ci_t));
  weight_grad_kernel<E><<<grid, kThreads, 0, s>>>(map, rel.n_out, rel.kernel_volume, static_cast<const E*>(a.x),
                                                  a.c_in, static_cast<const E*>(a.dy), a.c_out, rows_per_chunk,
                                                  chunks, partial.data<float>());
  LATTICE_CUDA_CHECK_LAUNCH();
  reduce_chunks<E><<<blocks_for(n, 256) > 65535u * 32u ? 65535u * 32u : blocks_for(n, 256), 256, 0, s>>>(
      partial.data<float>(), chunks, n, static_cast<E*>(a.dw));
  LATTICE_CUDA_CHECK_LAUNCH();
}

template <class F>
void dispatch(const ConvArgs& a, F&& f) {
  if (a.dtype == Dtype::f32 && !a.allow_tf32)
    throw UnsupportedError("[conv implicit_gemm_sm80] dtype: expected float16 or bfloat16 (float32 needs "
                           "allow_tf32), got float32");
  dispatch_conv_dtype(a.dtype, "conv implicit_gemm_sm80", f);
}

}  // namespace

void conv_implicit_gemm_sm80_forward(const ConvArgs& args) {
  dispatch(args, [&](auto tag) { forward<typename decltype(tag)::type>(args); });
}

void conv_implicit_gemm_sm80_input_grad(const ConvArgs& args) {
  dispatch(args, [&](auto tag) { input_grad<typename decltype(tag)::type>(args); });
}

void conv_implicit_gemm_sm80_weight_grad(const ConvArgs& args) {
  dispatch(args, [&](auto tag) { weight_grad<typename decltype(tag)::type>(args); });
}

}  // namespace lattice::backend::cuda
