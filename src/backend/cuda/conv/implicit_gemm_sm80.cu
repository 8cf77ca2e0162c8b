// Constraints: CUDA device of tier tensor_core or above (sm_80+); f16 or bf16, or f32 only with
// allow_tf32 (tf32 tensor cores); any relation kind, any kernel volume, any edge count, any
// channel counts (tiles are guarded, no multiple-of-8 requirement; 16-byte vector copies only
// when the channel counts and pointers allow, element loads otherwise). Deterministic:
// bitwise-identical results for the same inputs, device and build (no float atomics; an integer
// shared-memory OR builds each tile's offset mask).
//
// Tensor-core implicit GEMM (nvcuda::wmma mma.sync, f32 accumulation).
//   forward / input_grad: a thread block owns an output tile of BM destination rows x BN
//   destination channels, BM / 16 warps of 32 rows x BN / 2 columns. The tile shape is chosen per
//   call from the data: BN = 128 when there are more than 64 destination channels (the gathered
//   source rows are read once per row tile, not once per 64 channels), else 64; BM = 128 when the
//   average row has at least half the offsets (dense blocks: more reuse of each weight stage),
//   else 64 (LiDAR-like scans: a smaller tile of mask-ordered rows visits fewer offsets, and the
//   finer grid fills the last wave). The results do not depend on the shape. The rows come in the
//   relation's mask order when the view carries one (rows sorted by their offset mask, so a
//   tile's rows share offsets: on a LiDAR scan's submanifold 3^3 relation a tile of 128
//   index-ordered rows sees ~21 of the 27 offsets, a tile of mask-ordered rows ~6), in index
//   order otherwise. It first reads the tile's map rows once (into shared memory, for kernel
//   volumes up to 32, so no stage's gather waits on a global load of the map) and builds the list
//   of the offsets present in the tile (kernel volumes above 512 skip nothing), then walks those
//   offsets k in ascending order and, per offset, the source channels in steps of 64 bytes (32
//   f16/bf16 or 16 f32 channels): A = the gathered source rows (-1 -> zeros), B = the matching
//   slice of W[k] (or W[k]^T, kept col-major in shared memory). Stages are triple-buffered: the
//   copies of the next two stages are in flight while the current one is multiplied (cp.async
//   16-byte copies with zero-fill, and 16-byte stores of the result rows, when both channel
//   counts are multiples of 16 bytes and the source / weight / destination pointers are 16-byte
//   aligned; plain element loads and stores otherwise). The accumulation order (offset, then
//   channel) is fixed by the data, so results are bitwise reproducible.
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
//   64 x 64 tile of dW[k], or 128 x 128 for f16 / bf16 when both channel counts pass 64) runs a triple-buffered
//   pipeline over steps of 32 edges and writes dW
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
#include <atomic>
#include <cstdint>
#include <cstdlib>

#include "backend/cuda/common/conv_support.cuh"
#include "backend/cuda/runtime/check.h"
#include "backend/cuda/runtime/stream.h"
#include "backend/kernels.h"
#include "lattice/core/error.h"

namespace lattice::backend::cuda {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kWBM = 64;        // weight_grad: the tile size the runs are cut for (C_in)
constexpr int kWBN = 64;        // (C_out): 64 x 64, whichever tile the kernel then takes
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

// Shared-memory layout of the forward / input_grad kernel: tiles of BM destination rows x BN
// destination channels (dynamic shared memory: the pipeline stages, reused by the epilogue's f32
// tile, then the tile's map rows when the kernel volume is at most kMapCacheK).
constexpr int kMapCacheK = 32;
__host__ __device__ constexpr int map_ld(int k) { return k % 2 ? k : k + 1; }  // odd: no bank conflicts
template <class E, int BM, int BN>
struct FwdSmem {
  static constexpr int lda = kBK<E> + kPad<E>;   // A: BM rows x kBK source channels
  static constexpr int ldb = BN + kPad<E>;       // B: kBK rows x BN (row-major, forward)
  static constexpr int ldbt = kBK<E> + kPad<E>;  // B^T: BN rows x kBK (input_grad: B col-major)
  static constexpr int ldc = BN + kCPad;
  static constexpr int a_elems = BM * lda;
  static constexpr int b_elems = (kBK<E> * ldb > BN * ldbt) ? kBK<E> * ldb : BN * ldbt;
  static constexpr int stage_elems = a_elems + b_elems;
  static constexpr int pipe_bytes = kStages * stage_elems * static_cast<int>(sizeof(E));
  static constexpr int c_bytes = BM * ldc * static_cast<int>(sizeof(float));
  static constexpr int main_bytes = ((pipe_bytes > c_bytes ? pipe_bytes : c_bytes) + 127) / 128 * 128;
  static constexpr int map_bytes(int k) { return k <= kMapCacheK ? BM * map_ld(k) * 4 : 0; }
  static_assert((a_elems * sizeof(E)) % 128 == 0 && (stage_elems * sizeof(E)) % 128 == 0, "stage alignment");
};
template <int BM, int BN>
constexpr int kMinBlocks = BM == 64 ? (BN == 64 ? 6 : 4) : (BN == 64 ? 3 : 2);

// dst (n_dst, c_dst) = round(bias + sum_k gather_{map[:, k]}(src) @ B_k), with
// B_k(r, c) = w[k * c_src * c_dst + r * c_dst + c] (kTrans false) or
//             w[k * c_src * c_dst + c * c_src + r] (kTrans true: W[k]^T), r < c_src, c < c_dst.
// Tile rows are order[row0 .. row0 + BM) when `order` is given (rows sorted by offset mask, so a
// tile's rows share offsets), rows row0 .. row0 + BM otherwise. Each row's sum visits the
// offsets present in its tile in ascending order; offsets the row lacks add exact zeros, so the
// order changes at most the sign of a zero result. A tile is BM (64 or 128) destination rows x
// BN (64 or 128) destination channels, BM / 16 warps of 32 rows x BN / 2 columns. For kernel
// volumes up to kMapCacheK the tile's map rows are read once into shared memory (with the offset
// mask), so no stage's gather waits on a global load of the map; the present offsets are listed
// once per tile. The results do not depend on BM or BN: every element's sum runs over the same
// offsets and channel steps in the same order.
// kVector: 16-byte cp.async gathers and 16-byte stores (c_src and c_dst multiples of kVec<E>,
// src, w and dst 16-byte aligned); otherwise plain element loads into the same buffers.
// Channel counts are below 2^31 (the launcher checks).
// kLean (with kVector; the launcher checks both conditions): kernel volume <= kMapCacheK (the map
// rows always in shared memory) and every element offset below 2^31 (n_src * c_src and
// K * c_src * c_dst), so each stage's copies are addressed from per-thread offsets computed once
// before the pipeline (32-bit offsets from a per-stage base) instead of 64-bit index math per
// vector and stage. The same copies land in the same places: the results are bitwise those of the
// general path.
template <class E, bool kVector, bool kTrans, int BM, int BN, bool kLean>
__global__ void __launch_bounds__(BM * 2, kMinBlocks<BM, BN>)
    implicit_gemm_kernel(const std::int32_t* __restrict__ map, const std::int32_t* __restrict__ order,
                         std::int64_t n_dst, std::int64_t kernel_volume, const E* __restrict__ src,
                         int c_src, const E* __restrict__ w, int c_dst, const E* __restrict__ bias,
                         E* __restrict__ dst) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using M = MmaOf<E>;
  using S = FwdSmem<E, BM, BN>;
  constexpr int kT = BM * 2;     // threads
  constexpr int BK = kBK<E>;
  constexpr int V = kVec<E>;
  constexpr int WN = BN / 2;     // warp tile columns
  constexpr int NJ = WN / 16;    // accumulator fragments per warp row
  using LayoutB = std::conditional_t<kTrans, wmma::col_major, wmma::row_major>;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ unsigned mask[kMaskWords];
  __shared__ std::int16_t koff[32 * kMaskWords];  // present offsets, ascending
  __shared__ int n_present_s;
  __shared__ std::int32_t rows[BM];  // destination row of each tile row, -1 past the end
  E* const stage_base = reinterpret_cast<E*>(smem);
  float* const cs = reinterpret_cast<float*>(smem);  // epilogue only (after the pipeline drained)
  std::int32_t* const smap = reinterpret_cast<std::int32_t*>(smem + S::main_bytes);

  const int tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32;
  const int wr = warp / 2, wc = warp % 2;  // warp tile: rows wr*32.., columns wc*WN..
  const std::int64_t row0 = static_cast<std::int64_t>(blockIdx.x) * BM;
  const int col0 = static_cast<int>(blockIdx.y) * BN;
  const int tile_rows = n_dst - row0 < BM ? static_cast<int>(n_dst - row0) : BM;  // >= 1
  static_assert(!kLean || kVector, "the lean path copies 16-byte vectors");
  const E zero = from_f32<E>(0.0f);
  const bool mask_all = !kLean && kernel_volume > 32 * kMaskWords;
  const bool cached = kLean || kernel_volume <= kMapCacheK;
  const int kv = cached ? static_cast<int>(kernel_volume) : 0;
  const int mld = map_ld(cached ? kv : 1);

  if (tid < kMaskWords) mask[tid] = 0u;
  if (tid < BM) {
    const std::int64_t r = row0 + tid;
    rows[tid] = r < n_dst ? (order ? order[r] : static_cast<std::int32_t>(r)) : -1;
  }
  __syncthreads();
  // Offsets present in the tile: one pass over its map rows. For kernel volumes up to
  // kMapCacheK (one mask word) each warp takes whole rows, a lane per offset, keeps them in
  // shared memory and ORs its bits once into the shared word.
  if (cached) {
    unsigned bits = 0u;
    for (int r = warp; r < tile_rows; r += kT / 32) {
      if (lane < kv) {
        const std::int32_t v = map[static_cast<std::int64_t>(rows[r]) * kv + lane];
        smap[r * mld + lane] = v;
        if (v >= 0) bits |= 1u << lane;
      }
    }
    bits = __reduce_or_sync(0xffffffffu, bits);
    if (lane == 0 && bits) atomicOr(&mask[0], bits);  // integer OR: order-independent
  } else if (!mask_all) {
    const int kvl = static_cast<int>(kernel_volume);  // <= 512 here
    const int n = tile_rows * kvl;
    for (int idx = tid; idx < n; idx += kT) {
      const int r = idx / kvl;
      const int k = idx - r * kvl;
      if (map[static_cast<std::int64_t>(rows[r]) * kernel_volume + k] >= 0)
        atomicOr(&mask[k / 32], 1u << (k % 32));  // integer OR: order-independent
    }
  }
  __syncthreads();
  // The present offsets in ascending order (warp 0: one ballot per mask word).
  if (!mask_all && warp == 0) {
    int count = 0;
    for (int q = 0; q < kMaskWords; ++q) {
      const unsigned word = mask[q];
      if ((word >> lane) & 1u) koff[count + __popc(word & ((1u << lane) - 1u))] = static_cast<std::int16_t>(q * 32 + lane);
      count += __popc(word);
    }
    if (lane == 0) n_present_s = count;
  }
  __syncthreads();
  const int n_present = mask_all ? static_cast<int>(kernel_volume) : n_present_s;
  const int csteps = (c_src + BK - 1) / BK;
  const int total = n_present * csteps;  // stages: (present offset, channel step) pairs

  // This thread's A vectors: tile row, and the offset of its map entries in the shared map (-1
  // past the end). The same rows in every stage.
  constexpr int kAPer = BM * BK / V / kT;
  static_assert(kAPer == 2, "A: two vectors per thread");
  int arow_s[kAPer];
#pragma unroll
  for (int t = 0; t < kAPer; ++t) {
    const int r = (tid + t * kT) / (BK / V);
    arow_s[t] = rows[r] >= 0 ? r * mld : -1;
  }
  constexpr int kBPer = BK * BN / V / kT;  // B vectors per thread
  static_assert(kBPer * kT * V == BK * BN, "B: whole vectors per thread");
  const std::int64_t per_offset = static_cast<std::int64_t>(c_src) * c_dst;

  // The lean path's per-thread copy plan, the same in every stage: for each A vector its place in
  // the stage, its map slot and its channel within the step; for each B vector its place in the
  // stage, its element offset from the stage's weight base, and what bounds it.
  int la_smem[kAPer], la_ch[kAPer];
  int lb_smem[kBPer], lb_goff[kBPer], lb_step[kBPer];
  bool lb_ok[kBPer];
  if constexpr (kLean) {
#pragma unroll
    for (int t = 0; t < kAPer; ++t) {
      const int idx = tid + t * kT;
      la_smem[t] = (idx / (BK / V)) * S::lda + (idx % (BK / V)) * V;
      la_ch[t] = (idx % (BK / V)) * V;
    }
#pragma unroll
    for (int t = 0; t < kBPer; ++t) {
      const int idx = tid + t * kT;
      if constexpr (!kTrans) {  // B(r, c) = wk[(c0 + r) * c_dst + col0 + c]
        const int r = idx / (BN / V), q = idx % (BN / V);
        lb_smem[t] = r * S::ldb + q * V;
        lb_goff[t] = r * c_dst + col0 + q * V;
        lb_step[t] = r;
        lb_ok[t] = col0 + q * V < c_dst;
      } else {  // B(r, c) = wk[(col0 + c) * c_src + c0 + r]
        const int c = idx / (BK / V), q = idx % (BK / V);
        lb_smem[t] = c * S::ldbt + q * V;
        lb_goff[t] = (col0 + c) * c_src + q * V;
        lb_step[t] = q * V;
        lb_ok[t] = col0 + c < c_dst;
      }
    }
  }
  const int per_offset32 = kLean ? c_src * c_dst : 0;  // < 2^31 on the lean path

  // Loads the stage (offset k, source channels c0..c0+BK) into buffer `buf`.
  auto issue = [&](int k, int c0, int buf) {
    E* as = stage_base + buf * S::stage_elems;
    if constexpr (kLean) {
      E* bs = as + S::a_elems;
      const E* src_c0 = src + c0;
#pragma unroll
      for (int t = 0; t < kAPer; ++t) {
        const std::int32_t v = arow_s[t] >= 0 ? smap[arow_s[t] + k] : -1;
        const bool ok = v >= 0 && c0 + la_ch[t] < c_src;
        cp_async16(as + la_smem[t], ok ? src_c0 + (v * c_src + la_ch[t]) : src, ok);
      }
      const E* wbase = w + (k * per_offset32 + (kTrans ? c0 : c0 * c_dst));
#pragma unroll
      for (int t = 0; t < kBPer; ++t) {
        const bool ok = lb_ok[t] && c0 + lb_step[t] < c_src;
        cp_async16(bs + lb_smem[t], ok ? wbase + lb_goff[t] : w, ok);
      }
      return;
    }
    E* bs = as + S::a_elems;
#pragma unroll
    for (int t = 0; t < kAPer; ++t) {
      const int idx = tid + t * kT;
      const int r = idx / (BK / V), q = idx % (BK / V);
      std::int32_t v = -1;
      if (arow_s[t] >= 0) {
        if (cached)
          v = smap[arow_s[t] + k];
        else
          v = map[static_cast<std::int64_t>(rows[r]) * kernel_volume + k];  // rows[r] >= 0 here
      }
      const int ch = c0 + q * V;
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
    const E* wk = w + k * per_offset;
#pragma unroll
    for (int t = 0; t < kBPer; ++t) {
      const int idx = tid + t * kT;
      if constexpr (!kTrans) {
        // B(r, c) = wk[(c0 + r) * c_dst + col0 + c], stored bs[r * ldb + c].
        const int r = idx / (BN / V), q = idx % (BN / V);
        const int ch = c0 + r, co = col0 + q * V;
        E* d = bs + r * S::ldb + q * V;
        if constexpr (kVector) {
          const bool ok = ch < c_src && co < c_dst;  // c_dst % V == 0
          cp_async16(d, ok ? wk + static_cast<std::int64_t>(ch) * c_dst + co : w, ok);
        } else {
#pragma unroll
          for (int e = 0; e < V; ++e)
            d[e] = (ch < c_src && co + e < c_dst) ? wk[static_cast<std::int64_t>(ch) * c_dst + co + e] : zero;
        }
      } else {
        // B(r, c) = wk[(col0 + c) * c_src + c0 + r], stored bs[c * ldbt + r] (col-major B).
        const int c = idx / (BK / V), q = idx % (BK / V);
        const int ci = col0 + c, ch = c0 + q * V;
        E* d = bs + c * S::ldbt + q * V;
        if constexpr (kVector) {
          const bool ok = ci < c_dst && ch < c_src;  // c_src % V == 0
          cp_async16(d, ok ? wk + static_cast<std::int64_t>(ci) * c_src + ch : w, ok);
        } else {
#pragma unroll
          for (int e = 0; e < V; ++e)
            d[e] = (ci < c_dst && ch + e < c_src) ? wk[static_cast<std::int64_t>(ci) * c_src + ch + e] : zero;
        }
      }
    }
  };

  wmma::fragment<wmma::accumulator, 16, 16, M::K, float> acc[2][NJ];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < NJ; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

  // kStages-deep pipeline over the stages (offsets ascending, then channel steps ascending): the
  // copies of stage i + kStages - 1 are in flight while stage i is multiplied.
  int next_p = 0, next_c = 0;  // the next stage to issue: present offset index, channel start
  auto issue_next = [&](int buf) {
    issue(mask_all ? next_p : koff[next_p], next_c, buf);
    next_c += BK;
    if (next_c >= c_src) {
      next_c = 0;
      ++next_p;
    }
  };
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < total) issue_next(st);
    cp_async_commit();  // possibly empty group: keeps the count uniform
  }
  int rbuf = 0, wbuf = kStages - 1;  // buffer read this stage, buffer the stage kStages - 1 ahead fills
  for (int i = 0; i < total; ++i) {
    cp_async_wait<kStages - 2>();  // stage i has landed (this thread's copies) ...
    __syncthreads();               // ... for every thread; and every warp is done with stage i - 1
    if (i + kStages - 1 < total) issue_next(wbuf);  // into the buffer stage i - 1 used
    cp_async_commit();
    const E* as = stage_base + rbuf * S::stage_elems;
    const E* bs = as + S::a_elems;
    rbuf = rbuf + 1 == kStages ? 0 : rbuf + 1;
    wbuf = wbuf + 1 == kStages ? 0 : wbuf + 1;
#pragma unroll
    for (int kk = 0; kk < BK; kk += M::K) {
      wmma::fragment<wmma::matrix_a, 16, 16, M::K, typename M::frag, wmma::row_major> fa[2];
      wmma::fragment<wmma::matrix_b, 16, 16, M::K, typename M::frag, LayoutB> fb[NJ];
#pragma unroll
      for (int i2 = 0; i2 < 2; ++i2) {
        wmma::load_matrix_sync(fa[i2], as + (wr * 32 + i2 * 16) * S::lda + kk, S::lda);
        to_tf32_if_needed<E>(fa[i2]);
      }
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        if constexpr (kTrans)
          wmma::load_matrix_sync(fb[j], bs + (wc * WN + j * 16) * S::ldbt + kk, S::ldbt);
        else
          wmma::load_matrix_sync(fb[j], bs + kk * S::ldb + wc * WN + j * 16, S::ldb);
        to_tf32_if_needed<E>(fb[j]);
      }
#pragma unroll
      for (int i2 = 0; i2 < 2; ++i2)
#pragma unroll
        for (int j = 0; j < NJ; ++j) wmma::mma_sync(acc[i2][j], fa[i2], fb[j], acc[i2][j]);
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the pipeline buffers: they are reused as cs below

#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < NJ; ++j)
      wmma::store_matrix_sync(cs + (wr * 32 + i * 16) * S::ldc + wc * WN + j * 16, acc[i][j], S::ldc,
                              wmma::mem_row_major);
  __syncthreads();
  if constexpr (kVector) {
    // V channels per thread and step: one 16-byte store per (row, V-channel group).
    for (int idx = tid; idx < BM * (BN / V); idx += kT) {
      const int r = idx / (BN / V), c = (idx % (BN / V)) * V;
      const int co = col0 + c;
      const std::int32_t row = rows[r];
      if (row >= 0 && co < c_dst) {  // c_dst % V == 0: the whole vector is in range
        alignas(16) E out[V];
#pragma unroll
        for (int e = 0; e < V; ++e) {
          float v = cs[r * S::ldc + c + e];
          if (bias) v += to_f32(bias[co + e]);
          out[e] = from_f32<E>(v);
        }
        *reinterpret_cast<uint4*>(dst + static_cast<std::int64_t>(row) * c_dst + co) =
            *reinterpret_cast<const uint4*>(out);
      }
    }
  } else {
    for (int idx = tid; idx < BM * BN; idx += kT) {
      const int r = idx / BN, c = idx % BN;
      const int co = col0 + c;
      const std::int32_t row = rows[r];
      if (row >= 0 && co < c_dst) {
        float v = cs[r * S::ldc + c];
        if (bias) v += to_f32(bias[co]);
        dst[static_cast<std::int64_t>(row) * c_dst + co] = from_f32<E>(v);
      }
    }
  }
#else
  __trap();  // built for an architecture without these mma shapes; admission requires sm_80+
#endif
}

// Shared-memory layout of the weight-gradient kernel with T x T tiles of dW[k] (dynamic shared
// memory: kStages stages of A and B, kWBK edges each, reused by the epilogue's f32 tile).
template <class E, int T>
struct WgSmem {
  static constexpr int lda = T + kPad<E>;  // A stored (edge, C_in): col-major A
  static constexpr int ldb = T + kPad<E>;  // B stored (edge, C_out): row-major B
  static constexpr int ldc = T + kCPad;
  static constexpr int a_elems = kWBK * lda;
  static constexpr int stage_elems = a_elems + kWBK * ldb;
  static constexpr int pipe_bytes = kStages * stage_elems * static_cast<int>(sizeof(E));
  static constexpr int c_bytes = T * ldc * static_cast<int>(sizeof(float));
  static constexpr int bytes = ((pipe_bytes > c_bytes ? pipe_bytes : c_bytes) + 127) / 128 * 128;
  static_assert((a_elems * sizeof(E)) % 128 == 0 && (stage_elems * sizeof(E)) % 128 == 0, "stage alignment");
};

// dW[k] (C_in, C_out) = sum over the edges e of offset k (k_ptr[k] <= e < k_ptr[k+1], inputs
// k_in, outputs k_out) of x[k_in[e]]^T dy[k_out[e]]: only real edges are read. Offset k's edges
// are cut into runs of `run` edges (the last one shorter; a data-only length, a multiple of kWBK):
// runs of offset k are run_ptr[k] .. run_ptr[k+1] - 1 in one numbering over all offsets, and
// run_k[j] is the offset of run j, so every block does about the same work whatever the offsets'
// sizes. blockIdx.x = run (blocks past run_ptr[K] exit), blockIdx.y = C_out tile, blockIdx.z =
// C_in tile; a tile is T x T (64: four warps of 32 x 32; 128: eight warps of 32 x 64, so each
// gathered edge row is read once per 128 channels). A block walks its run in steps of kWBK edges
// through a kStages-deep cp.async pipeline. An offset of one run writes dw rounded; otherwise
// each run writes its f32 partial, partial[j] (C_in, C_out), which reduce_runs adds in ascending
// run order. Every element's sum (steps in edge order, each step's edges in mma order) is the
// same for T = 64 and 128.
template <class E, bool kVector, int T>
__global__ void __launch_bounds__(T * 2, T == 64 ? 4 : 2)
    weight_grad_kernel(const std::int64_t* __restrict__ k_ptr, const std::int64_t* __restrict__ run_ptr,
                       const std::int32_t* __restrict__ run_k, std::int64_t run,
                       const std::int32_t* __restrict__ k_in, const std::int32_t* __restrict__ k_out,
                       std::int64_t kernel_volume, const E* __restrict__ x, std::int64_t c_in,
                       const E* __restrict__ dy, std::int64_t c_out, float* __restrict__ partial,
                       E* __restrict__ dw) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using M = MmaOf<E>;
  using S = WgSmem<E, T>;
  constexpr int kT = T * 2;     // threads
  constexpr int V = kVec<E>;
  constexpr int WN = T / 2;     // warp tile columns (C_out)
  constexpr int NJ = WN / 16;
  extern __shared__ __align__(128) unsigned char smem[];
  E* const stage_base = reinterpret_cast<E*>(smem);
  float* const cs = reinterpret_cast<float*>(smem);

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int wr = warp / 2, wc = warp % 2;  // warp tile: C_in rows wr*32.., C_out columns wc*WN..
  const std::int64_t j_run = blockIdx.x;
  if (j_run >= run_ptr[kernel_volume]) return;  // the grid is an upper bound on the runs
  const std::int64_t k = run_k[j_run];
  const std::int64_t first = run_ptr[k];
  const bool single = run_ptr[k + 1] - first == 1;
  const std::int64_t co0 = static_cast<std::int64_t>(blockIdx.y) * T;
  const std::int64_t ci0 = static_cast<std::int64_t>(blockIdx.z) * T;
  const std::int64_t ke = k_ptr[k + 1];
  const std::int64_t e_begin = k_ptr[k] + (j_run - first) * run;
  const std::int64_t e_end = e_begin + run < ke ? e_begin + run : ke;
  const E zero = from_f32<E>(0.0f);

  // Loads edges eb..eb+kWBK: A (edge, ci) = x[k_in[e]][ci0 + ci], B (edge, co) = dy[k_out[e]][co0 + co].
  auto issue = [&](std::int64_t eb, int buf) {
    E* as = stage_base + buf * S::stage_elems;
    E* bs = as + S::a_elems;
    constexpr int per_row = T / V;  // vectors per edge row
#pragma unroll
    for (int t = 0; t < kWBK * per_row / kT; ++t) {
      const int idx = tid + t * kT;
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
  static_assert((kWBK * (T / kVec<E>)) % kT == 0, "weight_grad load split");

  wmma::fragment<wmma::accumulator, 16, 16, M::K, float> acc[2][NJ];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < NJ; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

  const int steps = static_cast<int>((e_end - e_begin + kWBK - 1) / kWBK);  // <= run / kWBK
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < steps) issue(e_begin + static_cast<std::int64_t>(st) * kWBK, st);
    cp_async_commit();  // possibly empty group: keeps the count uniform
  }
  int rbuf = 0, wbuf = kStages - 1;
  for (int i = 0; i < steps; ++i) {
    cp_async_wait<kStages - 2>();  // step i has landed (this thread's copies) ...
    __syncthreads();               // ... for every thread; and every warp is done with step i - 1
    if (i + kStages - 1 < steps) issue(e_begin + static_cast<std::int64_t>(i + kStages - 1) * kWBK, wbuf);
    cp_async_commit();
    const E* as = stage_base + rbuf * S::stage_elems;
    const E* bs = as + S::a_elems;
    rbuf = rbuf + 1 == kStages ? 0 : rbuf + 1;
    wbuf = wbuf + 1 == kStages ? 0 : wbuf + 1;
#pragma unroll
    for (int kk = 0; kk < kWBK; kk += M::K) {
      wmma::fragment<wmma::matrix_a, 16, 16, M::K, typename M::frag, wmma::col_major> fa[2];
      wmma::fragment<wmma::matrix_b, 16, 16, M::K, typename M::frag, wmma::row_major> fb[NJ];
#pragma unroll
      for (int i2 = 0; i2 < 2; ++i2) {
        wmma::load_matrix_sync(fa[i2], as + kk * S::lda + wr * 32 + i2 * 16, S::lda);
        to_tf32_if_needed<E>(fa[i2]);
      }
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        wmma::load_matrix_sync(fb[j], bs + kk * S::ldb + wc * WN + j * 16, S::ldb);
        to_tf32_if_needed<E>(fb[j]);
      }
#pragma unroll
      for (int i2 = 0; i2 < 2; ++i2)
#pragma unroll
        for (int j = 0; j < NJ; ++j) wmma::mma_sync(acc[i2][j], fa[i2], fb[j], acc[i2][j]);
    }
  }
  cp_async_wait<0>();
  __syncthreads();

#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < NJ; ++j)
      wmma::store_matrix_sync(cs + (wr * 32 + i * 16) * S::ldc + wc * WN + j * 16, acc[i][j], S::ldc,
                              wmma::mem_row_major);
  __syncthreads();
  const std::int64_t base = k * c_in * c_out;
  float* out = single ? nullptr : partial + j_run * c_in * c_out;
  for (int idx = tid; idx < T * T; idx += kT) {
    const int r = idx / T, c = idx % T;
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

// A pass without its map builds it from the output-major edge list, which must then be there.
void check_edges_for_map(const RelationView& rel, const std::int32_t* map) {
  LATTICE_ASSERT(map || rel.n_edges == 0 || (rel.in_idx && rel.out_idx && rel.k_idx),
                 "conv implicit_gemm_sm80: neither the map nor the edge list (in_idx, out_idx, k_idx) is given");
}

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

template <class E, bool kVector, bool kTrans, int BM, int BN, bool kLean>
void launch_tile(const std::int32_t* map, const std::int32_t* order, std::int64_t n_dst, std::int64_t kernel_volume,
                 const E* src, std::int64_t c_src, const E* w, std::int64_t c_dst, const E* bias, E* dst, int device,
                 cudaStream_t s) {
  using S = FwdSmem<E, BM, BN>;
  const std::int64_t rt = tiles(n_dst, BM), ct = tiles(c_dst, BN);
  check_grid(rt, ct);
  const dim3 grid(static_cast<unsigned>(rt), static_cast<unsigned>(ct));
  const int bytes = S::main_bytes + S::map_bytes(static_cast<int>(std::min<std::int64_t>(kernel_volume, 1 << 20)));
  auto kernel = implicit_gemm_kernel<E, kVector, kTrans, BM, BN, kLean>;
  // The dynamic shared-memory limit is an attribute of this kernel in the current device's
  // context: raised once per device (to the largest size any kernel volume asks for).
  static std::atomic<std::uint64_t> raised{0};
  const std::uint64_t bit = std::uint64_t{1} << (device & 63);
  if (!(raised.load(std::memory_order_acquire) & bit)) {
    LATTICE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            S::main_bytes + S::map_bytes(kMapCacheK)));
    raised.fetch_or(bit, std::memory_order_acq_rel);
  }
  kernel<<<grid, BM * 2, bytes, s>>>(map, order, n_dst, kernel_volume, src, static_cast<int>(c_src), w,
                                     static_cast<int>(c_dst), bias, dst);
  LATTICE_CUDA_CHECK_LAUNCH();
}

template <class E, bool kVector, bool kTrans, bool kLean>
void launch_shape(int bm, int bn, const std::int32_t* map, const std::int32_t* order, std::int64_t n_dst,
                  std::int64_t kernel_volume, const E* src, std::int64_t c_src, const E* w, std::int64_t c_dst,
                  const E* bias, E* dst, int device, cudaStream_t s) {
  if (bm == 64 && bn == 64)
    launch_tile<E, kVector, kTrans, 64, 64, kLean>(map, order, n_dst, kernel_volume, src, c_src, w, c_dst, bias, dst, device, s);
  else if (bm == 64)
    launch_tile<E, kVector, kTrans, 64, 128, kLean>(map, order, n_dst, kernel_volume, src, c_src, w, c_dst, bias, dst, device, s);
  else if (bn == 64)
    launch_tile<E, kVector, kTrans, 128, 64, kLean>(map, order, n_dst, kernel_volume, src, c_src, w, c_dst, bias, dst, device, s);
  else
    launch_tile<E, kVector, kTrans, 128, 128, kLean>(map, order, n_dst, kernel_volume, src, c_src, w, c_dst, bias, dst, device, s);
}

// The lean copy path (see implicit_gemm_kernel) only with LATTICE_IGEMM_LEAN=1, until a GPU run
// has checked and timed it: a measurement switch for the in-process A/B of docs/performance.md
// ("implicit_gemm_sm80, lean stage copies"), read per call (a getenv per launch) so one process
// can alternate the two paths.
bool lean_enabled() {
  const char* v = std::getenv("LATTICE_IGEMM_LEAN");
  return v && v[0] == '1';
}

// dst = gather-GEMM over the map (see implicit_gemm_kernel); picks the 16-byte path when every
// vector load and store is aligned and in range, else the element path, and tiles of 128
// destination channels when there are more than 64 (the gathered source rows are then read once
// per row tile instead of once per 64 channels).
template <class E, bool kTrans>
void launch_implicit_gemm(const std::int32_t* map, const std::int32_t* order, std::int64_t n_dst,
                          std::int64_t n_src, std::int64_t kernel_volume, std::int64_t n_edges, const E* src,
                          std::int64_t c_src, const E* w, std::int64_t c_dst, const E* bias, E* dst, int device,
                          cudaStream_t s) {
  LATTICE_ASSERT(c_src < (std::int64_t{1} << 31) && c_dst < (std::int64_t{1} << 31),
                 "conv implicit_gemm_sm80: channel counts must be below 2^31");
  const bool vec = c_src % kVec<E> == 0 && c_dst % kVec<E> == 0 && aligned16(src) && aligned16(w) && aligned16(dst);
  // Rows per tile: 128 when the average row has at least half the offsets (a dense block: little
  // to gain from a finer tile mask, more reuse of each B stage), else 64 (LiDAR-like scans: a
  // 64-row tile of mask-ordered rows visits fewer offsets, and the finer grid fills the SMs'
  // last wave better). Measured on the H200 (docs/performance.md, "implicit_gemm_sm80 tiles").
  const std::int64_t kv_eff = std::min<std::int64_t>(kernel_volume, kMapCacheK);
  const int bm = 2 * n_edges >= n_dst * kv_eff ? 128 : 64;
  const int bn = c_dst > 64 ? 128 : 64;
  // The lean path: 16-byte copies, the map rows in shared memory, and every offset it forms
  // (including those of out-of-range vectors, whose copies it skips) below 2^31.
  constexpr std::int64_t kI32 = std::int64_t{1} << 31;
  // (as quotients: the products themselves could pass int64 for huge inputs)
  const bool lean = vec && kernel_volume <= kMapCacheK && n_src + 1 < kI32 / (c_src + 64) &&
                    c_src + 128 < kI32 / (kernel_volume + 1) / (c_dst + 128) && lean_enabled();
  if (lean)
    launch_shape<E, true, kTrans, true>(bm, bn, map, order, n_dst, kernel_volume, src, c_src, w, c_dst, bias, dst, device, s);
  else if (vec)
    launch_shape<E, true, kTrans, false>(bm, bn, map, order, n_dst, kernel_volume, src, c_src, w, c_dst, bias, dst, device, s);
  else
    launch_shape<E, false, kTrans, false>(bm, bn, map, order, n_dst, kernel_volume, src, c_src, w, c_dst, bias, dst, device, s);
}

template <class E, bool kVector, int T>
void launch_weight_grad(std::int64_t runs, std::int64_t c_in, std::int64_t c_out, const RelationView& rel,
                        const std::int64_t* run_ptr, const std::int32_t* run_k, std::int64_t run, const E* x,
                        const E* dy, float* partial, E* dw, int device, cudaStream_t s) {
  using S = WgSmem<E, T>;
  const std::int64_t ci_t = tiles(c_in, T), co_t = tiles(c_out, T);
  const dim3 grid(static_cast<unsigned>(runs), static_cast<unsigned>(co_t), static_cast<unsigned>(ci_t));
  auto kernel = weight_grad_kernel<E, kVector, T>;
  static std::atomic<std::uint64_t> raised{0};  // see launch_tile
  const std::uint64_t bit = std::uint64_t{1} << (device & 63);
  if (!(raised.load(std::memory_order_acquire) & bit)) {
    LATTICE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, S::bytes));
    raised.fetch_or(bit, std::memory_order_acq_rel);
  }
  kernel<<<grid, T * 2, S::bytes, s>>>(rel.k_ptr, run_ptr, run_k, run, rel.k_in, rel.k_out, rel.kernel_volume, x,
                                       c_in, dy, c_out, partial, dw);
  LATTICE_CUDA_CHECK_LAUNCH();
}

template <class E>
void forward(const ConvArgs& a) {
  const RelationView& rel = a.rel;
  check_edges_for_map(rel, rel.gemm_map);
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
  // The forward does not read the count: the tile shape takes it when the relation knows it (a
  // hint or an earlier count), else assumes a sparse scan.
  const std::int64_t edges_hint = rel.n_edges > 0 ? rel.n_edges : (rel.known_edges > 0 ? rel.known_edges : 0);
  launch_implicit_gemm<E, false>(map, order, rel.n_out, rel.n_in, rel.kernel_volume, edges_hint, static_cast<const E*>(a.x), a.c_in,
                                 static_cast<const E*>(a.w), a.c_out, static_cast<const E*>(a.bias),
                                 static_cast<E*>(a.y), a.device.index, s);
}

template <class E>
void input_grad(const ConvArgs& a) {
  const RelationView& rel = a.rel;
  check_edges_for_map(rel, rel.input_gemm_map);
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
  launch_implicit_gemm<E, true>(map, order, rel.n_in, rel.n_out, rel.kernel_volume, rel.n_edges, static_cast<const E*>(a.dy),
                                a.c_out, static_cast<const E*>(a.w), a.c_in, nullptr, static_cast<E*>(a.dx), a.device.index, s);
}

template <class E>
void weight_grad(const ConvArgs& a) {
  const RelationView& rel = a.rel;
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
  const E* x = static_cast<const E*>(a.x);
  const E* dy = static_cast<const E*>(a.dy);
  E* dw = static_cast<E*>(a.dw);
  const bool vec = a.c_in % kVec<E> == 0 && a.c_out % kVec<E> == 0 && aligned16(x) && aligned16(dy);
  const std::int64_t* rp = run_ptr.data<std::int64_t>();
  const std::int32_t* rk = run_k.data<std::int32_t>();
  float* part = partial.data<float>();
  // 128 x 128 tiles of dW[k] for 2-byte dtypes when both channel counts pass 64 (each gathered
  // edge row is then read once per 128 channels instead of once per 64), else 64 x 64 (float32's
  // 128-tile stages would pass the 99 KB per block of sm_86 / sm_89); the runs stay the same, so
  // do the sums.
  const int device = a.device.index;
  if (sizeof(E) == 2 && a.c_in > 64 && a.c_out > 64) {
    if (vec)
      launch_weight_grad<E, true, 128>(runs, a.c_in, a.c_out, rel, rp, rk, run, x, dy, part, dw, device, s);
    else
      launch_weight_grad<E, false, 128>(runs, a.c_in, a.c_out, rel, rp, rk, run, x, dy, part, dw, device, s);
  } else {
    if (vec)
      launch_weight_grad<E, true, 64>(runs, a.c_in, a.c_out, rel, rp, rk, run, x, dy, part, dw, device, s);
    else
      launch_weight_grad<E, false, 64>(runs, a.c_in, a.c_out, rel, rp, rk, run, x, dy, part, dw, device, s);
  }
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
