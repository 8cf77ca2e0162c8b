// Constraints: CUDA device of tier tensor_core or above (sm_80+); f16 or bf16, or f32 only with
// allow_tf32 (tf32 tensor cores); any relation kind, any kernel volume, any edge count, any
// channel counts (tiles are guarded, no multiple-of-8 requirement; 16-byte vector copies only
// when the channel counts and pointers allow, element loads otherwise). Deterministic:
// bitwise-identical results for the same inputs, device and build (no float atomics; an integer
// shared-memory OR builds each tile's offset mask).
//
// Tensor-core implicit GEMM (nvcuda::wmma mma.sync, f32 accumulation).
//   forward / input_grad: a thread block of eight warps owns an output tile of 128 destination
//   rows x 64 destination channels. The rows come in the relation's mask order when the view
//   carries one (rows sorted by their offset mask, so a tile's rows share offsets: on a LiDAR
//   scan's submanifold 3^3 relation a tile of index-ordered rows sees ~21 of the 27 offsets, a
//   tile of mask-ordered rows ~6), in index order otherwise. It first reads the tile's map rows
//   once into a shared bitmask of the offsets present in the tile (kernel volumes above 512 skip
//   nothing), then walks the present offsets k in ascending order and, per offset, the
//   source channels in steps of 64 bytes (32 f16/bf16 or 16 f32 channels): A = the gathered
//   source rows (-1 -> zeros), B = the matching slice of W[k] (or W[k]^T, kept col-major in
//   shared memory). Stages are triple-buffered: the copies of the next two stages are in flight
//   while the current one is multiplied (cp.async 16-byte copies with zero-fill when both channel counts
//   are multiples of 16 bytes and the source / weight pointers are 16-byte aligned; plain element
//   loads into the same buffers otherwise). The accumulation order (offset, then channel) is
//   fixed by the data, so results are bitwise reproducible.
//     forward     map = the relation's N_out x K gemm_map (built on the device when the view has
//                 none); source x, destination y, B = W[k] (C_in, C_out); bias added at the end.
//     input_grad  map = the input-side (n_in, K) map of output rows (the relation's cached one, or
//                 built here from the edges: a scatter with unique (i, k) slots, so deterministic); source
//                 dy, destination dx, B = W[k]^T (C_out, C_in).
//   weight_grad: dW[k] (C_in, C_out) = sum over the edges of offset k (the per-offset grouping
//   k_ptr / k_in / k_out, so only real edges are read) of x[k_in[e]]^T dy[k_out[e]]. Each
//   offset's edges are cut into runs of a data-only length (E, K and the channel counts decide
//   it), numbered over all offsets so that blocks get equal work however unequal the offsets are
//   (a submanifold conv's centre offset has every row, the others a few percent); each block (run,
//   64 x 64 tile of dW[k]) runs a double-buffered pipeline over steps of 32 edges and writes dW
//   rounded (its offset's only run) or its f32 partial, which a second kernel adds in ascending
//   run order.
// Each output element is rounded to the storage dtype once, at the end.
//
// Shapes (K = kernel volume): x (n_in, C_in), w (K, C_in, C_out), bias (C_out) or null,
//   y (n_out, C_out), dy (n_out, C_out), dx (n_in, C_in), dw (K, C_in, C_out).
//   Buffers: the maps (int32), the run table (K + 1 int64, runs int32) and weight-gradient
//   partials (runs, C_in, C_out) f32.
#include <mma.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/common/conv_support.cuh"
#include "backend/cuda/runtime/check.h"
#include "backend/cuda/runtime/stream.h"
#include "backend/kernels.h"
#include "lattice/core/error.h"

namespace lattice::backend::cuda {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kThreads = 256;   // forward / input_grad: eight warps, each a 32 x 32 piece of the tile
constexpr int kBM = 128;        // destination rows per tile
constexpr int kBN = 64;         // destination channels per tile
constexpr int kWThreads = 128;  // weight_grad: four warps, each a 32 x 32 piece of a 64 x 64 dW tile
constexpr int kWBM = 64;        // weight_grad tile rows (C_in)
constexpr int kWBN = 64;        // weight_grad tile columns (C_out)
constexpr int kWBK = 32;        // weight_grad reduction step (edges)
constexpr int kMaskWords = 16;  // per-tile offset mask: offsets >= 512 are never skipped
constexpr int kStages = 3;      // forward / input_grad pipeline depth (stages in flight)

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

// Elements per 16-byte vector, reduction step of the forward tile (64 bytes of a row), and
// shared-memory row padding (16 bytes: rows stay 16-byte aligned for cp.async and every
// fragment pointer 32-byte aligned).
template <class E> constexpr int kVec = 16 / static_cast<int>(sizeof(E));
template <class E> constexpr int kBK = 64 / static_cast<int>(sizeof(E));
template <class E> constexpr int kPad = 16 / static_cast<int>(sizeof(E));
constexpr int kCPad = 4;

template <class E, class Frag>
__device__ __forceinline__ void to_tf32_if_needed(Frag& f) {
  if constexpr (std::is_same_v<E, float>) {
#pragma unroll
    for (int t = 0; t < f.num_elements; ++t) f.x[t] = wmma::__float_to_tf32(f.x[t]);
  }
}

// 16-byte asynchronous copy global -> shared; when !valid nothing is read and the 16 bytes are
// zero-filled (src-size 0). Both addresses 16-byte aligned.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n) : "memory");
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// Shared-memory layout of the forward / input_grad kernel (element offsets within one stage).
template <class E>
struct FwdSmem {
  static constexpr int lda = kBK<E> + kPad<E>;   // A: kBM rows x kBK source channels
  static constexpr int ldb = kBN + kPad<E>;      // B: kBK rows x kBN (row-major, forward)
  static constexpr int ldbt = kBK<E> + kPad<E>;  // B^T: kBN rows x kBK (input_grad: B col-major)
  static constexpr int ldc = kBN + kCPad;
  static constexpr int a_elems = kBM * lda;
  static constexpr int b_elems = (kBK<E> * ldb > kBN * ldbt) ? kBK<E> * ldb : kBN * ldbt;
  static constexpr int stage_elems = a_elems + b_elems;
  static constexpr int pipe_bytes = kStages * stage_elems * static_cast<int>(sizeof(E));
  static constexpr int c_bytes = kBM * ldc * static_cast<int>(sizeof(float));
  static constexpr int bytes = pipe_bytes > c_bytes ? pipe_bytes : c_bytes;
  static_assert((a_elems * sizeof(E)) % 128 == 0 && (stage_elems * sizeof(E)) % 128 == 0, "stage alignment");
  static_assert(bytes + kBM * 4 + kMaskWords * 4 <= 48 * 1024, "static shared memory");
};

// dst (n_dst, c_dst) = round(bias + sum_k gather_{map[:, k]}(src) @ B_k), with
// B_k(r, c) = w[k * c_src * c_dst + r * c_dst + c] (kTrans false) or
//             w[k * c_src * c_dst + c * c_src + r] (kTrans true: W[k]^T), r < c_src, c < c_dst.
// Tile rows are order[row0 .. row0 + kBM) when `order` is given (rows sorted by offset mask, so a
// tile's rows share offsets), rows row0 .. row0 + kBM otherwise. Each row's sum visits the
// offsets present in its tile in ascending order; offsets the row lacks add exact zeros, so the
// order changes at most the sign of a zero result.
// kVector: 16-byte cp.async gathers (c_src and c_dst multiples of kVec<E>, src and w 16-byte
// aligned); otherwise plain element loads into the same buffers.
template <class E, bool kVector, bool kTrans>
__global__ void __launch_bounds__(kThreads)
    implicit_gemm_kernel(const std::int32_t* __restrict__ map, const std::int32_t* __restrict__ order,
                         std::int64_t n_dst, std::int64_t kernel_volume, const E* __restrict__ src,
                         std::int64_t c_src, const E* __restrict__ w, std::int64_t c_dst,
                         const E* __restrict__ bias, E* __restrict__ dst) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using M = MmaOf<E>;
  using S = FwdSmem<E>;
  constexpr int BK = kBK<E>;
  constexpr int V = kVec<E>;
  using LayoutB = std::conditional_t<kTrans, wmma::col_major, wmma::row_major>;
  __shared__ __align__(128) unsigned char smem[S::bytes];
  __shared__ unsigned mask[kMaskWords];
  __shared__ std::int32_t rows[kBM];  // destination row of each tile row, -1 past the end
  E* const stage_base = reinterpret_cast<E*>(smem);
  float* const cs = reinterpret_cast<float*>(smem);  // epilogue only (after the pipeline drained)

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int wr = warp / 2, wc = warp % 2;  // warp tile: rows wr*32.., columns wc*32..
  const std::int64_t row0 = static_cast<std::int64_t>(blockIdx.x) * kBM;
  const std::int64_t col0 = static_cast<std::int64_t>(blockIdx.y) * kBN;
  const std::int64_t per_offset = c_src * c_dst;
  const std::int64_t tile_rows = n_dst - row0 < kBM ? n_dst - row0 : kBM;  // >= 1
  const E zero = from_f32<E>(0.0f);
  const bool mask_all = kernel_volume > 32 * kMaskWords;

  if (tid < kMaskWords) mask[tid] = 0u;
  if (tid < kBM) {
    const std::int64_t r = row0 + tid;
    rows[tid] = r < n_dst ? (order ? order[r] : static_cast<std::int32_t>(r)) : -1;
  }
  __syncthreads();
  // Offsets present in the tile: one pass over its map rows (contiguous runs of K entries).
  if (!mask_all) {
    const int kv = static_cast<int>(kernel_volume);  // <= 512 here
    const int n = static_cast<int>(tile_rows) * kv;
    for (int idx = tid; idx < n; idx += kThreads) {
      const int r = idx / kv;
      const int k = idx - r * kv;
      if (map[static_cast<std::int64_t>(rows[r]) * kernel_volume + k] >= 0)
        atomicOr(&mask[k / 32], 1u << (k % 32));  // integer OR: order-independent
    }
  }
  __syncthreads();
  auto next_offset = [&](std::int64_t k) -> std::int64_t {  // first present offset after k
    if (mask_all) return k + 1;
    for (std::int64_t j = k + 1; j < kernel_volume;) {
      const unsigned word = mask[j / 32] >> (j % 32);
      if (word) {
        const std::int64_t found = j + __ffs(static_cast<int>(word)) - 1;
        return found < kernel_volume ? found : kernel_volume;
      }
      j = (j / 32 + 1) * 32;
    }
    return kernel_volume;
  };
  std::int64_t n_present = kernel_volume;
  if (!mask_all) {
    n_present = 0;
    for (int q = 0; q < kMaskWords; ++q) n_present += __popc(mask[q]);
  }
  const std::int64_t csteps = (c_src + BK - 1) / BK;
  const std::int64_t total = n_present * csteps;  // stages: (present offset, channel step) pairs

  // The map rows of this thread's two A vectors (the same rows in every stage), null past the end.
  constexpr int kAPer = kBM * BK / V / kThreads;
  static_assert(kAPer == 2, "A: two vectors per thread");
  const std::int32_t* arow[kAPer];
#pragma unroll
  for (int t = 0; t < kAPer; ++t) {
    const int r = (tid + t * kThreads) / (BK / V);
    arow[t] = rows[r] >= 0 ? map + static_cast<std::int64_t>(rows[r]) * kernel_volume : nullptr;
  }

  // Loads the stage (offset k, source channels c0..c0+BK) into buffer `buf`.
  auto issue = [&](std::int64_t k, std::int64_t c0, int buf) {
    E* as = stage_base + buf * S::stage_elems;
    E* bs = as + S::a_elems;
#pragma unroll
    for (int t = 0; t < kAPer; ++t) {
      const int idx = tid + t * kThreads;
      const int r = idx / (BK / V), q = idx % (BK / V);
      const std::int32_t v = arow[t] ? arow[t][k] : -1;
      const std::int64_t ch = c0 + q * V;
      E* d = as + r * S::lda + q * V;
      if constexpr (kVector) {
        const bool ok = v >= 0 && ch < c_src;  // c_src % V == 0: the whole vector is in range
        cp_async16(d, ok ? src + static_cast<std::int64_t>(v) * c_src + ch : src, ok);
      } else {
        const E* s = src + (v >= 0 ? static_cast<std::int64_t>(v) : 0) * c_src;
#pragma unroll
        for (int e = 0; e < V; ++e) d[e] = (v >= 0 && ch + e < c_src) ? s[ch + e] : zero;
      }
    }
    // B: BK x kBN = BK * kBN / V vectors (1 per thread).
    const E* wk = w + k * per_offset;
    if constexpr (!kTrans) {
      // B(r, c) = wk[(c0 + r) * c_dst + col0 + c], stored bs[r * ldb + c].
      const int r = tid / (kBN / V), q = tid % (kBN / V);
      const std::int64_t ch = c0 + r, co = col0 + q * V;
      E* d = bs + r * S::ldb + q * V;
      if constexpr (kVector) {
        const bool ok = ch < c_src && co < c_dst;  // c_dst % V == 0
        cp_async16(d, ok ? wk + ch * c_dst + co : w, ok);
      } else {
#pragma unroll
        for (int e = 0; e < V; ++e) d[e] = (ch < c_src && co + e < c_dst) ? wk[ch * c_dst + co + e] : zero;
      }
    } else {
      // B(r, c) = wk[(col0 + c) * c_src + c0 + r], stored bs[c * ldbt + r] (col-major B).
      const int c = tid / (BK / V), q = tid % (BK / V);
      const std::int64_t ci = col0 + c, ch = c0 + q * V;
      E* d = bs + c * S::ldbt + q * V;
      if constexpr (kVector) {
        const bool ok = ci < c_dst && ch < c_src;  // c_src % V == 0
        cp_async16(d, ok ? wk + ci * c_src + ch : w, ok);
      } else {
#pragma unroll
        for (int e = 0; e < V; ++e) d[e] = (ci < c_dst && ch + e < c_src) ? wk[ci * c_src + ch + e] : zero;
      }
    }
  };
  static_assert(kBK<E> * kBN / kVec<E> == kThreads, "B: one vector per thread");

  wmma::fragment<wmma::accumulator, 16, 16, M::K, float> acc[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

  // kStages-deep pipeline over the stages (k ascending over present offsets, c0 ascending): the
  // copies of stage i + kStages - 1 are in flight while stage i is multiplied.
  std::int64_t ik = next_offset(-1), ic = 0;  // the next stage to issue
  auto advance = [&] {
    ic += BK;
    if (ic >= c_src) {
      ic = 0;
      ik = next_offset(ik);
    }
  };
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < total) {
      issue(ik, ic, st);
      advance();
    }
    cp_async_commit();  // possibly empty group: keeps the count uniform
  }
  for (std::int64_t i = 0; i < total; ++i) {
    cp_async_wait<kStages - 2>();  // stage i has landed (this thread's copies) ...
    __syncthreads();               // ... for every thread; and every warp is done with stage i - 1
    const std::int64_t ahead = i + kStages - 1;
    if (ahead < total) {
      issue(ik, ic, static_cast<int>(ahead % kStages));  // into the buffer stage i - 1 used
      advance();
    }
    cp_async_commit();
    const E* as = stage_base + static_cast<int>(i % kStages) * S::stage_elems;
    const E* bs = as + S::a_elems;
#pragma unroll
    for (int kk = 0; kk < BK; kk += M::K) {
      wmma::fragment<wmma::matrix_a, 16, 16, M::K, typename M::frag, wmma::row_major> fa[2];
      wmma::fragment<wmma::matrix_b, 16, 16, M::K, typename M::frag, LayoutB> fb[2];
#pragma unroll
      for (int i2 = 0; i2 < 2; ++i2) {
        wmma::load_matrix_sync(fa[i2], as + (wr * 32 + i2 * 16) * S::lda + kk, S::lda);
        to_tf32_if_needed<E>(fa[i2]);
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        if constexpr (kTrans)
          wmma::load_matrix_sync(fb[j], bs + (wc * 32 + j * 16) * S::ldbt + kk, S::ldbt);
        else
          wmma::load_matrix_sync(fb[j], bs + kk * S::ldb + wc * 32 + j * 16, S::ldb);
        to_tf32_if_needed<E>(fb[j]);
      }
#pragma unroll
      for (int i2 = 0; i2 < 2; ++i2)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i2][j], fa[i2], fb[j], acc[i2][j]);
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the pipeline buffers: they are reused as cs below

#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(cs + (wr * 32 + i * 16) * S::ldc + wc * 32 + j * 16, acc[i][j], S::ldc,
                              wmma::mem_row_major);
  __syncthreads();
  for (int idx = tid; idx < kBM * kBN; idx += kThreads) {
    const int r = idx / kBN, c = idx % kBN;
    const std::int64_t co = col0 + c;
    const std::int32_t row = rows[r];
    if (row >= 0 && co < c_dst) {
      float v = cs[r * S::ldc + c];
      if (bias) v += to_f32(bias[co]);
      dst[static_cast<std::int64_t>(row) * c_dst + co] = from_f32<E>(v);
    }
  }
#else
  __trap();  // built for an architecture without these mma shapes; admission requires sm_80+
#endif
}

// Shared-memory layout of the weight-gradient kernel (one stage: A and B, kWBK edges each).
template <class E>
struct WgSmem {
  static constexpr int lda = kWBM + kPad<E>;  // A stored (edge, C_in): col-major A
  static constexpr int ldb = kWBN + kPad<E>;  // B stored (edge, C_out): row-major B
  static constexpr int ldc = kWBN + kCPad;
  static constexpr int a_elems = kWBK * lda;
  static constexpr int stage_elems = a_elems + kWBK * ldb;
  static constexpr int pipe_bytes = 2 * stage_elems * static_cast<int>(sizeof(E));
  static constexpr int c_bytes = kWBM * ldc * static_cast<int>(sizeof(float));
  static constexpr int bytes = pipe_bytes > c_bytes ? pipe_bytes : c_bytes;
  static_assert((a_elems * sizeof(E)) % 128 == 0 && (stage_elems * sizeof(E)) % 128 == 0, "stage alignment");
};

// dW[k] (C_in, C_out) = sum over the edges e of offset k (k_ptr[k] <= e < k_ptr[k+1], inputs
// k_in, outputs k_out) of x[k_in[e]]^T dy[k_out[e]]: only real edges are read. Offset k's edges
// are cut into runs of `run` edges (the last one shorter; a data-only length, a multiple of kWBK):
// runs of offset k are run_ptr[k] .. run_ptr[k+1] - 1 in one numbering over all offsets, and
// run_k[j] is the offset of run j, so every block does about the same work whatever the offsets'
// sizes. blockIdx.x = run (blocks past run_ptr[K] exit), blockIdx.y = C_out tile, blockIdx.z =
// C_in tile. An offset of one run writes dw rounded; otherwise each run writes its f32 partial,
// partial[j] (C_in, C_out), which reduce_runs adds in ascending run order.
template <class E, bool kVector>
__global__ void __launch_bounds__(kWThreads)
    weight_grad_kernel(const std::int64_t* __restrict__ k_ptr, const std::int64_t* __restrict__ run_ptr,
                       const std::int32_t* __restrict__ run_k, std::int64_t run,
                       const std::int32_t* __restrict__ k_in, const std::int32_t* __restrict__ k_out,
                       std::int64_t kernel_volume, const E* __restrict__ x, std::int64_t c_in,
                       const E* __restrict__ dy, std::int64_t c_out, float* __restrict__ partial,
                       E* __restrict__ dw) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using M = MmaOf<E>;
  using S = WgSmem<E>;
  constexpr int V = kVec<E>;
  __shared__ __align__(128) unsigned char smem[S::bytes];
  E* const stage_base = reinterpret_cast<E*>(smem);
  float* const cs = reinterpret_cast<float*>(smem);

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int wr = warp / 2, wc = warp % 2;
  const std::int64_t j_run = blockIdx.x;
  if (j_run >= run_ptr[kernel_volume]) return;  // the grid is an upper bound on the runs
  const std::int64_t k = run_k[j_run];
  const std::int64_t first = run_ptr[k];
  const bool single = run_ptr[k + 1] - first == 1;
  const std::int64_t co0 = static_cast<std::int64_t>(blockIdx.y) * kWBN;
  const std::int64_t ci0 = static_cast<std::int64_t>(blockIdx.z) * kWBM;
  const std::int64_t ke = k_ptr[k + 1];
  const std::int64_t e_begin = k_ptr[k] + (j_run - first) * run;
  const std::int64_t e_end = e_begin + run < ke ? e_begin + run : ke;
  const E zero = from_f32<E>(0.0f);

  // Loads edges eb..eb+kWBK: A (edge, ci) = x[k_in[e]][ci0 + ci], B (edge, co) = dy[k_out[e]][co0 + co].
  auto issue = [&](std::int64_t eb, int buf) {
    E* as = stage_base + buf * S::stage_elems;
    E* bs = as + S::a_elems;
    constexpr int per_row = kWBM / V;  // vectors per edge row (kWBM == kWBN)
#pragma unroll
    for (int t = 0; t < kWBK * per_row / kWThreads; ++t) {
      const int idx = tid + t * kWThreads;
      const int r = idx / per_row, q = idx % per_row;
      const std::int64_t e = eb + r;
      const bool live = e < e_end;
      const std::int64_t xi = live ? static_cast<std::int64_t>(k_in[e]) : 0;
      const std::int64_t oi = live ? static_cast<std::int64_t>(k_out[e]) : 0;
      const std::int64_t ci = ci0 + q * V, co = co0 + q * V;
      E* da = as + r * S::lda + q * V;
      E* db = bs + r * S::ldb + q * V;
      if constexpr (kVector) {
        const bool oka = live && ci < c_in, okb = live && co < c_out;  // channel counts % V == 0
        cp_async16(da, oka ? x + xi * c_in + ci : x, oka);
        cp_async16(db, okb ? dy + oi * c_out + co : dy, okb);
      } else {
#pragma unroll
        for (int u = 0; u < V; ++u) {
          da[u] = (live && ci + u < c_in) ? x[xi * c_in + ci + u] : zero;
          db[u] = (live && co + u < c_out) ? dy[oi * c_out + co + u] : zero;
        }
      }
    }
  };
  static_assert(kWBM == kWBN && (kWBK * (kWBM / kVec<E>)) % kWThreads == 0, "weight_grad load split");

  wmma::fragment<wmma::accumulator, 16, 16, M::K, float> acc[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

  int buf = 0;
  if (e_begin < e_end) issue(e_begin, 0);
  cp_async_commit();
  for (std::int64_t eb = e_begin; eb < e_end; eb += kWBK) {
    if (eb + kWBK < e_end) issue(eb + kWBK, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const E* as = stage_base + buf * S::stage_elems;
    const E* bs = as + S::a_elems;
#pragma unroll
    for (int kk = 0; kk < kWBK; kk += M::K) {
      wmma::fragment<wmma::matrix_a, 16, 16, M::K, typename M::frag, wmma::col_major> fa[2];
      wmma::fragment<wmma::matrix_b, 16, 16, M::K, typename M::frag, wmma::row_major> fb[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        wmma::load_matrix_sync(fa[i], as + kk * S::lda + wr * 32 + i * 16, S::lda);
        to_tf32_if_needed<E>(fa[i]);
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        wmma::load_matrix_sync(fb[j], bs + kk * S::ldb + wc * 32 + j * 16, S::ldb);
        to_tf32_if_needed<E>(fb[j]);
      }
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
    __syncthreads();
    buf ^= 1;
  }
  cp_async_wait<0>();
  __syncthreads();

#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(cs + (wr * 32 + i * 16) * S::ldc + wc * 32 + j * 16, acc[i][j], S::ldc,
                              wmma::mem_row_major);
  __syncthreads();
  const std::int64_t base = k * c_in * c_out;
  float* out = single ? nullptr : partial + j_run * c_in * c_out;
  for (int idx = tid; idx < kWBM * kWBN; idx += kWThreads) {
    const int r = idx / kWBN, c = idx % kWBN;
    const std::int64_t ci = ci0 + r, co = co0 + c;
    if (ci < c_in && co < c_out) {
      const float v = cs[r * S::ldc + c];
      if (out)
        out[ci * c_out + co] = v;
      else
        dw[base + ci * c_out + co] = from_f32<E>(v);
    }
  }
#else
  __trap();  // built for an architecture without these mma shapes; admission requires sm_80+
#endif
}

// The runs of every offset (see weight_grad_kernel): run_ptr[k + 1] = run_ptr[k] + ceil(E_k / run)
// and run_k[j] = k for the runs j of offset k. One block; the counts are loaded in parallel and
// prefix-summed by one thread in shared memory.
constexpr int kRunThreads = 256;
__global__ void __launch_bounds__(kRunThreads)
    run_table_kernel(const std::int64_t* __restrict__ k_ptr, std::int64_t kernel_volume, std::int64_t run,
                     std::int64_t* __restrict__ run_ptr, std::int32_t* __restrict__ run_k) {
  __shared__ std::int64_t counts[kRunThreads];
  __shared__ std::int64_t carry;
  const int tid = threadIdx.x;
  if (tid == 0) {
    carry = 0;
    run_ptr[0] = 0;
  }
  for (std::int64_t base = 0; base < kernel_volume; base += kRunThreads) {
    const std::int64_t k = base + tid;
    const std::int64_t edges = k < kernel_volume ? k_ptr[k + 1] - k_ptr[k] : 0;
    counts[tid] = (edges + run - 1) / run;
    __syncthreads();
    if (tid == 0) {
      std::int64_t c = carry;
      for (int t = 0; t < kRunThreads; ++t) {
        c += counts[t];
        counts[t] = c;  // inclusive prefix: run_ptr[base + t + 1]
      }
      carry = c;
    }
    __syncthreads();
    if (k < kernel_volume) {
      const std::int64_t end = counts[tid];
      const std::int64_t begin = tid > 0 ? counts[tid - 1] : end - ((edges + run - 1) / run);
      run_ptr[k + 1] = end;
      for (std::int64_t j = begin; j < end; ++j) run_k[j] = static_cast<std::int32_t>(k);
    }
    __syncthreads();
  }
}

// dw[k, q] for offsets of several runs = round(sum over their runs j ascending of partial[j, q]);
// offsets without edges get zeros; offsets of one run were written by weight_grad_kernel.
template <class E>
__global__ void reduce_runs(const float* __restrict__ partial, const std::int64_t* __restrict__ run_ptr,
                            std::int64_t kernel_volume, std::int64_t per_offset, E* __restrict__ dw) {
  const std::int64_t n = kernel_volume * per_offset;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t k = i / per_offset, q = i - k * per_offset;
    const std::int64_t b = run_ptr[k], e = run_ptr[k + 1];
    if (e - b == 1) continue;
    float t = 0.0f;
    for (std::int64_t j = b; j < e; ++j) t += partial[j * per_offset + q];
    dw[i] = from_f32<E>(t);
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

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

// dst = gather-GEMM over the map (see implicit_gemm_kernel); picks the 16-byte path when every
// vector load is aligned and in range, else the element path.
template <class E, bool kTrans>
void launch_implicit_gemm(const std::int32_t* map, const std::int32_t* order, std::int64_t n_dst,
                          std::int64_t kernel_volume, const E* src, std::int64_t c_src, const E* w,
                          std::int64_t c_dst, const E* bias, E* dst, cudaStream_t s) {
  const std::int64_t rt = tiles(n_dst, kBM), ct = tiles(c_dst, kBN);
  check_grid(rt, ct);
  const dim3 grid(static_cast<unsigned>(rt), static_cast<unsigned>(ct));
  const bool vec = c_src % kVec<E> == 0 && c_dst % kVec<E> == 0 && aligned16(src) && aligned16(w);
  if (vec)
    implicit_gemm_kernel<E, true, kTrans><<<grid, kThreads, 0, s>>>(map, order, n_dst, kernel_volume, src, c_src,
                                                                     w, c_dst, bias, dst);
  else
    implicit_gemm_kernel<E, false, kTrans><<<grid, kThreads, 0, s>>>(map, order, n_dst, kernel_volume, src,
                                                                      c_src, w, c_dst, bias, dst);
  LATTICE_CUDA_CHECK_LAUNCH();
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
  const std::int32_t* order = rel.gemm_order;  // meaningful only with the relation's own map
  if (!map) {
    built = build_edge_map(rel.out_idx, rel.in_idx, rel.k_idx, rel.n_edges, rel.n_out, rel.kernel_volume, a.device);
    map = built.data<std::int32_t>();
    order = nullptr;
  }
  launch_implicit_gemm<E, false>(map, order, rel.n_out, rel.kernel_volume, static_cast<const E*>(a.x), a.c_in,
                                 static_cast<const E*>(a.w), a.c_out, static_cast<const E*>(a.bias),
                                 static_cast<E*>(a.y), s);
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
  // (n_in, K) map of output rows: input i reaches output map[i, k] through offset k. The
  // relation's cached one when the view carries it, else built here.
  Array built;
  const std::int32_t* map = rel.input_gemm_map;
  const std::int32_t* order = rel.input_gemm_order;
  if (!map) {
    built = build_edge_map(rel.in_idx, rel.out_idx, rel.k_idx, rel.n_edges, rel.n_in, rel.kernel_volume, a.device);
    map = built.data<std::int32_t>();
    order = nullptr;
  }
  // Source dy (C_out channels), destination dx (C_in), B_k = W[k]^T.
  launch_implicit_gemm<E, true>(map, order, rel.n_in, rel.kernel_volume, static_cast<const E*>(a.dy),
                                a.c_out, static_cast<const E*>(a.w), a.c_in, nullptr, static_cast<E*>(a.dx), s);
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
  LATTICE_ASSERT(rel.k_ptr && rel.k_in && rel.k_out,
                 "conv implicit_gemm_sm80 weight_grad: per-offset grouping (k_ptr, k_in, k_out) is null");
  // Runs of `run` edges per offset: a data-only length (E, K and the channel counts decide it, so
  // the same runs and sums on every run and device): 512 edges, doubled while the grid would pass
  // ~4096 blocks or the f32 partials 256 MiB. Runs never exceed E / run + K.
  const std::int64_t ci_t = tiles(a.c_in, kWBM), co_t = tiles(a.c_out, kWBN);
  std::int64_t run = 512;
  auto max_runs = [&] { return rel.n_edges / run + rel.kernel_volume; };
  while (run < (std::int64_t{1} << 40) &&
         (max_runs() * ci_t * co_t > 4096 || max_runs() * per_offset * 4 > (std::int64_t{256} << 20)))
    run *= 2;
  const std::int64_t runs = max_runs();
  LATTICE_ASSERT(runs <= 2147483647 && co_t <= 65535 && ci_t <= 65535,
                 "conv implicit_gemm_sm80 weight_grad: problem too large for the grid");
  Array run_ptr = Array::empty({rel.kernel_volume + 1}, Dtype::i64, a.device);
  Array run_k = Array::empty({runs}, Dtype::i32, a.device);
  Array partial = Array::empty({runs, a.c_in, a.c_out}, Dtype::f32, a.device);
  run_table_kernel<<<1, kRunThreads, 0, s>>>(rel.k_ptr, rel.kernel_volume, run, run_ptr.data<std::int64_t>(),
                                             run_k.data<std::int32_t>());
  LATTICE_CUDA_CHECK_LAUNCH();
  const dim3 grid(static_cast<unsigned>(runs), static_cast<unsigned>(co_t), static_cast<unsigned>(ci_t));
  const E* x = static_cast<const E*>(a.x);
  const E* dy = static_cast<const E*>(a.dy);
  E* dw = static_cast<E*>(a.dw);
  const bool vec = a.c_in % kVec<E> == 0 && a.c_out % kVec<E> == 0 && aligned16(x) && aligned16(dy);
  const std::int64_t* rp = run_ptr.data<std::int64_t>();
  const std::int32_t* rk = run_k.data<std::int32_t>();
  float* part = partial.data<float>();
  if (vec)
    weight_grad_kernel<E, true><<<grid, kWThreads, 0, s>>>(rel.k_ptr, rp, rk, run, rel.k_in, rel.k_out,
                                                           rel.kernel_volume, x, a.c_in, dy, a.c_out, part, dw);
  else
    weight_grad_kernel<E, false><<<grid, kWThreads, 0, s>>>(rel.k_ptr, rp, rk, run, rel.k_in, rel.k_out,
                                                            rel.kernel_volume, x, a.c_in, dy, a.c_out, part, dw);
  LATTICE_CUDA_CHECK_LAUNCH();
  const unsigned blocks = blocks_for(n, 256) > 65535u * 32u ? 65535u * 32u : blocks_for(n, 256);
  reduce_runs<E><<<blocks, 256, 0, s>>>(part, rp, rel.kernel_volume, per_offset, dw);
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

LATTICE_ROUTE_KERNELS(ConvKernels, conv_implicit_gemm_sm80, {
    .forward = cuda::conv_implicit_gemm_sm80_forward,
    .input_grad = cuda::conv_implicit_gemm_sm80_input_grad,
    .weight_grad = cuda::conv_implicit_gemm_sm80_weight_grad,
    .bias_grad = cuda::conv_cuda_bias_grad});
