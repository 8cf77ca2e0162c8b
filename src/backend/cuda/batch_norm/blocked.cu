// Constraints: CUDA (data on a cuda device, the CUDA backend built and a device present);
// features (N, C) of any float dtype (f16, bf16, f32, f64) with per-channel parameters and
// statistics in f32 (f64 for f64 features); any N (N >= 2 in training, checked by the
// semantic layer), including none, any C; training and eval, forward and backward, optional
// fused ReLU and residual input (added before the ReLU). Deterministic: fixed blocks of 32 rows
// reduced per (block, channel) in row order, their partials summed in double in a fixed order by one warp per channel (no
// atomics), so results are bitwise the same run to run and for any grid; the same order and
// arithmetic as the CPU parallel route.
//
// The reduction order is backend/common/batch_norm.h's, the same as the CPU `parallel` route's
// (and its arithmetic, with products kept out of FMAs: batch_norm::mul), so the two routes
// normally agree bit for bit; the tests compare them within rounding. Three launches per pass,
// all on the current stream of the args' device:
//   forward, training: moments (per (32-row block, channel): the block's mean, then its M2;
//     partials stored channel-major) -> finalize (one warp per channel: lane l sums blocks l,
//     l + 32, ... in order, in double, then a shfl_down tree: mean, then M2; invstd, running
//     statistics) -> normalize (elementwise).
//   forward, eval: eval_stats (one thread per channel) -> normalize.
//   backward: grad_sums (per (block, channel): sum dy', sum dy' * xhat) -> grad_finalize (one
//     warp per channel; dgamma, dbeta, the means k1, k2) -> grad_input (elementwise dx, and
//     the residual's gradient: dy masked by the output). Eval without dgamma: grad_input only.
//   A residual input is one more operand of normalize (y = relu(bn(x) + residual), the sum in
//   the accumulation type and rounded once, as on the CPU routes).
// How the memory is read (none of it changes an operand or the order of any sum, so the bits are
// those of one thread per (block, channel) and of the CPU route):
//   - moments and grad_sums copy a tile of whole 32-row blocks (contiguous rows, all channels)
//     into shared memory with 16-byte loads, then one thread per (block, channel) sums from
//     there (moments_tiled, grad_sums_tiled); when one block's rows of every input are wider
//     than 48 KiB (C > 768 for f16 moments, ...), one thread per (block, channel) reads its rows
//     from global memory into registers (moments_kernel, grad_sums_kernel).
//   - finalize and grad_finalize load sixteen blocks' partials ahead of their in-order adds.
//   - normalize and grad_input give each thread V consecutive channels for the whole pass
//     (pack_width: the widest of 16 bytes / sizeof(T), ..., 1 that divides C and to which the
//     pointers are aligned; one vector load per row and tensor) and stride over the rows.
//   - 16-bit elements are widened with the hardware conversion (fast_load).
// Scratch (the block partials) comes from the stream-ordered allocator (Array::empty).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "backend/common/batch_norm.h"
#include "backend/cuda/common/float16.cuh"
#include "backend/cuda/runtime/check.h"
#include "backend/cuda/runtime/stream.h"
#include "backend/kernels.h"
#include "lattice/core/array.h"

namespace lattice::backend::cuda {
namespace {

namespace bn = lattice::backend::batch_norm;

constexpr int kThreads = 256;

// A grid-stride loop's grid over n items (at least one block, at most 2^16 blocks: the loops
// stride over the rest).
unsigned grid_for(std::int64_t n) {
  const std::int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 ? 65535 : b));
}

template <class Acc>
__device__ inline Acc relu_acc(Acc v) {
  return v > Acc(0) || v != v ? v : Acc(0);  // max(v, 0); NaN stays NaN (torch.relu)
}

// A 16-bit element widened with the hardware conversion: exact, so equal to dev_load for every
// non-NaN input (a NaN gives a NaN, possibly with another payload; every output of this file is
// computed by float arithmetic, which returns the canonical NaN for any NaN operand, so no
// output bit depends on the payload). Short code matters in the unrolled loops below.
__device__ inline float fast_load(Half h) { return __half2float(__ushort_as_half(h.bits)); }
__device__ inline float fast_load(BFloat16 b) { return dev_load(b); }
__device__ inline float fast_load(float v) { return v; }
__device__ inline double fast_load(double v) { return v; }

// V consecutive channels per thread (V = 16 bytes / sizeof(T) where c and the pointers allow,
// down to 1): one aligned vector load per row and tensor instead of V scalar loads. Each channel's
// sums are still over its rows in ascending order with the same arithmetic, so V changes no bit.
template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <int V, class T>
__device__ inline Pack<T, V> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, V>*>(p);
}

// The widest V (elements per 16 bytes at most) that divides c and to which every pointer is
// aligned.
template <class T>
int pack_width(std::int64_t c, std::initializer_list<const void*> ptrs) {
  int v = static_cast<int>(16 / sizeof(T));
  while (v > 1) {
    bool ok = c % v == 0;
    for (const void* p : ptrs)
      if (p && reinterpret_cast<std::uintptr_t>(p) % (static_cast<std::uintptr_t>(v) * sizeof(T)) != 0) ok = false;
    if (ok) break;
    v /= 2;
  }
  return v;
}

bool aligned16(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (p && reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return false;
  return true;
}

// The register kernels, for C too wide for a shared-memory tile: one thread per (block,
// channel), a full block's rows loaded into registers ahead of the in-order sums.
template <class T>
__global__ void moments_kernel(const T* __restrict__ x, std::int64_t n, std::int64_t c, Accum<T>* __restrict__ bmean,
                               Accum<T>* __restrict__ bm2) {
  using Acc = Accum<T>;
  constexpr int kRows = static_cast<int>(bn::kBlockRows);
  const std::int64_t total = bn::block_count(n) * c;
  for (std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t b = t / c, ch = t - b * c;
    const std::int64_t r0 = b * bn::kBlockRows, nb = bn::block_rows(n, b);
    const T* p = x + r0 * c + ch;
    Acc m, m2 = Acc(0);
    if (nb == kRows) {
      // a full block: all 32 loads issued before the sums (they are independent), the rows then
      // summed from registers in row order, the second pass without a second read
      Acc v[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) v[r] = fast_load(p[r * c]);
      Acc s = Acc(0);
#pragma unroll
      for (int r = 0; r < kRows; ++r) s += v[r];
      m = s / static_cast<Acc>(nb);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const Acc d = v[r] - m;
        m2 += bn::mul(d, d);
      }
    } else {
      Acc s = Acc(0);
      for (std::int64_t r = 0; r < nb; ++r) s += fast_load(p[r * c]);
      m = s / static_cast<Acc>(nb);
      for (std::int64_t r = 0; r < nb; ++r) {
        const Acc d = fast_load(p[r * c]) - m;
        m2 += bn::mul(d, d);
      }
    }
    const std::int64_t blocks = total / c;
    bmean[ch * blocks + b] = m;
    bm2[ch * blocks + b] = m2;
  }
}

// The tiled block kernels (moments_tiled, grad_sums_tiled): a CTA copies a tile of `bpt`
// consecutive 32-row blocks, all C channels (contiguous memory: rows r0 .. r0 + 32 bpt), of each
// of its NT input tensors into shared memory with 16-byte loads, all of a thread's loads issued
// before its stores; then each thread sums one (block, channel) pair's rows from shared memory
// in ascending row order. A tile is at most kTileBudget bytes, so all of a wave's tiles are in
// flight at once; C too wide for one block per tile uses the register kernels.
constexpr std::int64_t kTileBudget = 48 * 1024;  // the dynamic shared memory of a launch without opt-in
constexpr int kTileThreads = 256;

struct TilePlan {
  std::int64_t blocks_per_tile = 0;  // 0: the tile does not fit (register kernels)
  std::int64_t tiles = 0;
  std::size_t smem = 0;
};

TilePlan tile_plan(std::int64_t n, std::int64_t c, std::size_t elem, int tensors) {
  TilePlan t;
  const std::int64_t block_bytes = bn::kBlockRows * c * static_cast<std::int64_t>(elem) * tensors;
  if (block_bytes > kTileBudget || n == 0) return t;
  std::int64_t bpt = kTileBudget / block_bytes;
  const std::int64_t want = (kTileThreads + c - 1) / c;  // enough pairs for every thread
  if (bpt > want) bpt = want;
  if (bpt < 1) bpt = 1;
  t.blocks_per_tile = bpt;
  t.tiles = (bn::block_count(n) + bpt - 1) / bpt;
  t.smem = static_cast<std::size_t>(bpt * block_bytes);
  return t;
}

unsigned tile_grid(std::int64_t tiles) { return static_cast<unsigned>(tiles > 1048576 ? 1048576 : tiles); }

// Copies count elements from each src[k] to dst[k] (shared memory), by 16-byte vectors when
// `vec` (every src 16-byte aligned; dst always is), four vectors per tensor and thread in flight.
template <int NT, class T>
__device__ inline void copy_tiles(const T* const (&src)[NT], T* const (&dst)[NT], std::int64_t count, bool vec) {
  constexpr int kE = static_cast<int>(16 / sizeof(T));
  const int tid = static_cast<int>(threadIdx.x), nt = static_cast<int>(blockDim.x);
  std::int64_t done = 0;
  if (vec) {
    const std::int64_t nvec = count / kE;
    for (std::int64_t i = tid; i < nvec; i += 4 * nt) {
      uint4 r[NT][4];
#pragma unroll
      for (int k = 0; k < NT; ++k)
#pragma unroll
        for (int u = 0; u < 4; ++u)
          if (i + u * nt < nvec) r[k][u] = reinterpret_cast<const uint4*>(src[k])[i + u * nt];
#pragma unroll
      for (int k = 0; k < NT; ++k)
#pragma unroll
        for (int u = 0; u < 4; ++u)
          if (i + u * nt < nvec) reinterpret_cast<uint4*>(dst[k])[i + u * nt] = r[k][u];
    }
    done = nvec * kE;
  }
  for (std::int64_t i = done + tid; i < count; i += nt)
#pragma unroll
    for (int k = 0; k < NT; ++k) dst[k][i] = src[k][i];
}

template <class T>
__global__ void __launch_bounds__(kTileThreads) moments_tiled(const T* __restrict__ x, std::int64_t n, std::int64_t c,
                                                               std::int64_t bpt, bool vec, Accum<T>* __restrict__ bmean,
                                                               Accum<T>* __restrict__ bm2) {
  using Acc = Accum<T>;
  constexpr int kRows = static_cast<int>(bn::kBlockRows);
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* tile = reinterpret_cast<T*>(smem_raw);
  const std::int64_t blocks = bn::block_count(n);
  for (std::int64_t ti = blockIdx.x; ti * bpt < blocks; ti += gridDim.x) {
    const std::int64_t b0 = ti * bpt, bcount = blocks - b0 < bpt ? blocks - b0 : bpt;
    const std::int64_t r0 = b0 * bn::kBlockRows, rows = n - r0 < bcount * kRows ? n - r0 : bcount * kRows;
    const T* src[1] = {x + r0 * c};
    T* const dst[1] = {tile};
    copy_tiles<1, T>(src, dst, rows * c, vec);
    __syncthreads();
    for (std::int64_t pi = threadIdx.x; pi < bcount * c; pi += blockDim.x) {
      const std::int64_t bl = pi / c, ch = pi - bl * c, b = b0 + bl;
      const std::int64_t nb = bn::block_rows(n, b);
      const T* q = tile + bl * kRows * c + ch;
      Acc m, m2 = Acc(0);
      if (nb == kRows) {
        Acc v[kRows];
#pragma unroll
        for (int r = 0; r < kRows; ++r) v[r] = fast_load(q[r * c]);
        Acc sum = Acc(0);
#pragma unroll
        for (int r = 0; r < kRows; ++r) sum += v[r];
        m = sum / static_cast<Acc>(nb);
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          const Acc d = v[r] - m;
          m2 += bn::mul(d, d);
        }
      } else {
        Acc sum = Acc(0);
        for (std::int64_t r = 0; r < nb; ++r) sum += fast_load(q[r * c]);
        m = sum / static_cast<Acc>(nb);
        for (std::int64_t r = 0; r < nb; ++r) {
          const Acc d = fast_load(q[r * c]) - m;
          m2 += bn::mul(d, d);
        }
      }
      bmean[ch * blocks + b] = m;
      bm2[ch * blocks + b] = m2;
    }
    __syncthreads();
  }
}

// The lane order of batch_norm::fixed_order_sum: lane l holds its sum of blocks l, l + 32, ...;
// after the tree, lane 0 holds the total (the other lanes hold partial trees).
__device__ inline double warp_tree(double v) {
  for (int off = bn::kLanes / 2; off > 0; off /= 2) v += __shfl_down_sync(0xffffffffu, v, off);
  return v;
}

// One warp per channel (warps of all blocks stride over the channels).
__device__ inline std::int64_t warp_id() {
  return (blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) / bn::kLanes;
}
__device__ inline std::int64_t warp_count() { return static_cast<std::int64_t>(gridDim.x) * blockDim.x / bn::kLanes; }

// Lane `lane`'s sum of term(b) over the blocks b = lane, lane + kLanes, ... in increasing order
// (batch_norm::fixed_order_sum's lane order): sixteen terms are evaluated (their loads issued) ahead
// of their adds, which are still made one at a time in block order.
template <class F>
__device__ inline double lane_sum(std::int64_t lane, std::int64_t blocks, F term) {
  constexpr int kAhead = 16;
  double s = 0.0;
  std::int64_t b = lane;
  for (; b + (kAhead - 1) * bn::kLanes < blocks; b += kAhead * bn::kLanes) {
    double t[kAhead];
#pragma unroll
    for (int k = 0; k < kAhead; ++k) t[k] = term(b + k * bn::kLanes);
#pragma unroll
    for (int k = 0; k < kAhead; ++k) s += t[k];
  }
  for (; b < blocks; b += bn::kLanes) s += term(b);
  return s;
}

template <class Acc>
__global__ void finalize_kernel(const Acc* __restrict__ bmean, const Acc* __restrict__ bm2, std::int64_t n,
                                std::int64_t c, double eps, double momentum, Acc* __restrict__ mean,
                                Acc* __restrict__ invstd, Acc* __restrict__ rm, Acc* __restrict__ rv) {
  const int lane = static_cast<int>(threadIdx.x % bn::kLanes);
  const std::int64_t blocks = bn::block_count(n);
  for (std::int64_t ch = warp_id(); ch < c; ch += warp_count()) {  // warp-uniform loop
    double s = lane_sum(lane, blocks, [&](std::int64_t b) { return bn::mean_term(bmean, n, blocks, ch, b); });
    s = warp_tree(s);
    const double m = n > 0 ? __shfl_sync(0xffffffffu, s, 0) / static_cast<double>(n) : 0.0;
    double q = lane_sum(lane, blocks, [&](std::int64_t b) { return bn::m2_term(bmean, bm2, n, blocks, ch, b, m); });
    q = warp_tree(q);
    if (lane == 0) {
      const double var = n > 0 ? q / static_cast<double>(n) : 0.0;
      mean[ch] = static_cast<Acc>(m);
      invstd[ch] = static_cast<Acc>(bn::inverse_std(var, eps));
      if (rm) rm[ch] = static_cast<Acc>(bn::running_update(static_cast<double>(rm[ch]), m, momentum));
      if (rv) rv[ch] = static_cast<Acc>(bn::running_update(static_cast<double>(rv[ch]), bn::unbiased(var, n), momentum));
    }
  }
}

template <class Acc>
__global__ void eval_stats_kernel(const Acc* __restrict__ rm, const Acc* __restrict__ rv, std::int64_t c, double eps,
                                  Acc* __restrict__ mean, Acc* __restrict__ invstd) {
  for (std::int64_t ch = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; ch < c;
       ch += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    mean[ch] = rm[ch];
    invstd[ch] = static_cast<Acc>(bn::inverse_std(static_cast<double>(rv[ch]), eps));
  }
}

// The elementwise kernels (normalize, grad_input) give each thread one group of V channels for
// the whole pass: thread t of a grid of rows_per_pass * (c / V) threads takes channels
// (t % (c / V)) * V + [0, V) and the rows t / (c / V), + rows_per_pass, ... (consecutive threads
// read consecutive channels of one row), so the per-channel factors are loaded once and no
// element pays a 64-bit modulo. The arithmetic per element is that of one thread per element.
struct ChannelGrid {
  std::int64_t rows_per_pass;
  unsigned blocks;
};

ChannelGrid channel_grid(std::int64_t n, std::int64_t groups) {
  constexpr std::int64_t kTargetThreads = 1 << 17;  // ~ a full H100 / H200 wave of 256-thread blocks
  std::int64_t rows = kTargetThreads / groups;
  if (rows < 1) rows = 1;
  if (rows > n) rows = n;
  const std::int64_t threads = rows * groups;
  const std::int64_t b = (threads + kThreads - 1) / kThreads;
  return {rows, static_cast<unsigned>(b < 1 ? 1 : (b > 2147483647 ? 2147483647 : b))};
}

template <class T, int V>
__global__ void normalize_kernel(const T* __restrict__ x, T* __restrict__ y, std::int64_t n, std::int64_t c,
                                 std::int64_t rows_per_pass, const Accum<T>* __restrict__ mean,
                                 const Accum<T>* __restrict__ invstd, const Accum<T>* __restrict__ gamma,
                                 const Accum<T>* __restrict__ beta, bool relu, const T* __restrict__ res) {
  using Acc = Accum<T>;
  const std::int64_t cv = c / V;
  const std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (t >= rows_per_pass * cv) return;
  const std::int64_t row0 = t / cv, ch0 = (t - row0 * cv) * V;
  Acc scale[V], shift[V], mu[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    scale[j] = gamma ? gamma[ch0 + j] * invstd[ch0 + j] : invstd[ch0 + j];
    shift[j] = beta ? beta[ch0 + j] : Acc(0);
    mu[j] = mean[ch0 + j];
  }
#pragma unroll 2
  for (std::int64_t r = row0; r < n; r += rows_per_pass) {
    const Pack<T, V> k = load_pack<V>(x + r * c + ch0);
    Pack<T, V> o;
    if (res) {  // the residual sum (in Acc, rounded once), then the ReLU: the CPU routes' order
      const Pack<T, V> q = load_pack<V>(res + r * c + ch0);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        Acc v = bn::mul(fast_load(k.v[j]) - mu[j], scale[j]) + shift[j] + fast_load(q.v[j]);
        if (relu) v = relu_acc(v);
        o.v[j] = dev_store<T>(v);
      }
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        Acc v = bn::mul(fast_load(k.v[j]) - mu[j], scale[j]) + shift[j];
        if (relu) v = relu_acc(v);
        o.v[j] = dev_store<T>(v);
      }
    }
    *reinterpret_cast<Pack<T, V>*>(y + r * c + ch0) = o;
  }
}

// dy' of V elements: dy masked by the forward's output when the ReLU was fused (both loaded
// unconditionally, so the loads of a chunk can all be in flight at once).
template <class T, int V>
__device__ inline void masked_grad(const Pack<T, V>& dy, const Pack<T, V>& ys, bool relu, Accum<T> (&g)[V]) {
  using Acc = Accum<T>;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const Acc d = fast_load(dy.v[j]);
    g[j] = relu && !(fast_load(ys.v[j]) > Acc(0)) ? Acc(0) : d;
  }
}

// dy' of element i: dy masked by the forward's output when the ReLU was fused.
template <class T>
__device__ inline Accum<T> masked_grad_at(const T* dy, const T* ys, bool relu, std::int64_t i) {
  using Acc = Accum<T>;
  if (relu && !(fast_load(ys[i]) > Acc(0))) return Acc(0);
  return fast_load(dy[i]);
}

template <class T>
__global__ void grad_sums_kernel(const T* __restrict__ x, const T* __restrict__ dy, const T* __restrict__ ys,
                                 bool relu, std::int64_t n, std::int64_t c, const Accum<T>* __restrict__ mean,
                                 const Accum<T>* __restrict__ invstd, Accum<T>* __restrict__ bdy,
                                 Accum<T>* __restrict__ bdyx) {
  using Acc = Accum<T>;
  constexpr int kRows = static_cast<int>(bn::kBlockRows);
  constexpr int kChunk = 16;  // rows loaded ahead at a time in a full block (registers: 3 x 16)
  const std::int64_t total = bn::block_count(n) * c;
  for (std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t b = t / c, ch = t - b * c;
    const std::int64_t r0 = b * bn::kBlockRows, nb = bn::block_rows(n, b);
    const Acc m = mean[ch], is = invstd[ch];
    Acc s = Acc(0), sx = Acc(0);
    if (nb == kRows) {
      const std::int64_t base = r0 * c + ch;
#pragma unroll
      for (int r0c = 0; r0c < kRows; r0c += kChunk) {
        Acc xv[kChunk], gv[kChunk];
#pragma unroll
        for (int r = 0; r < kChunk; ++r) {
          const std::int64_t i = base + static_cast<std::int64_t>(r0c + r) * c;
          xv[r] = fast_load(x[i]);
          gv[r] = masked_grad_at(dy, ys, relu, i);
        }
#pragma unroll
        for (int r = 0; r < kChunk; ++r) {  // rows in ascending order, as below
          const Acc xhat = (xv[r] - m) * is;
          s += gv[r];
          sx += bn::mul(gv[r], xhat);
        }
      }
    } else {
      for (std::int64_t r = 0; r < nb; ++r) {
        const std::int64_t i = (r0 + r) * c + ch;
        const Acc g = masked_grad_at(dy, ys, relu, i);
        const Acc xhat = (fast_load(x[i]) - m) * is;
        s += g;
        sx += bn::mul(g, xhat);
      }
    }
    const std::int64_t blocks = total / c;
    bdy[ch * blocks + b] = s;
    bdyx[ch * blocks + b] = sx;
  }
}

template <class T, bool kRelu>
__global__ void __launch_bounds__(kTileThreads) grad_sums_tiled(const T* __restrict__ x, const T* __restrict__ dy,
                                                                 const T* __restrict__ ys, std::int64_t n, std::int64_t c,
                                                                 std::int64_t bpt, bool vec,
                                                                 const Accum<T>* __restrict__ mean,
                                                                 const Accum<T>* __restrict__ invstd,
                                                                 Accum<T>* __restrict__ bdy, Accum<T>* __restrict__ bdyx) {
  using Acc = Accum<T>;
  constexpr int kRows = static_cast<int>(bn::kBlockRows);
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const std::int64_t blocks = bn::block_count(n);
  const std::int64_t tile_elems = bpt * kRows * c;
  T* tx = reinterpret_cast<T*>(smem_raw);
  T* tdy = tx + tile_elems;
  T* tys = tdy + tile_elems;
  for (std::int64_t ti = blockIdx.x; ti * bpt < blocks; ti += gridDim.x) {
    const std::int64_t b0 = ti * bpt, bcount = blocks - b0 < bpt ? blocks - b0 : bpt;
    const std::int64_t r0 = b0 * bn::kBlockRows, rows = n - r0 < bcount * kRows ? n - r0 : bcount * kRows;
    if constexpr (kRelu) {
      const T* src[3] = {x + r0 * c, dy + r0 * c, ys + r0 * c};
      T* const dst[3] = {tx, tdy, tys};
      copy_tiles<3, T>(src, dst, rows * c, vec);
    } else {
      const T* src[2] = {x + r0 * c, dy + r0 * c};
      T* const dst[2] = {tx, tdy};
      copy_tiles<2, T>(src, dst, rows * c, vec);
    }
    __syncthreads();
    for (std::int64_t pi = threadIdx.x; pi < bcount * c; pi += blockDim.x) {
      const std::int64_t bl = pi / c, ch = pi - bl * c, b = b0 + bl;
      const std::int64_t nb = bn::block_rows(n, b);
      const std::int64_t off = bl * kRows * c + ch;
      const Acc m = mean[ch], is = invstd[ch];
      Acc sum = Acc(0), sx = Acc(0);
      auto row = [&](std::int64_t r) {  // rows in ascending order
        const std::int64_t i = off + r * c;
        Acc g = fast_load(tdy[i]);
        if (kRelu && !(fast_load(tys[i]) > Acc(0))) g = Acc(0);
        const Acc xhat = (fast_load(tx[i]) - m) * is;
        sum += g;
        sx += bn::mul(g, xhat);
      };
      if (nb == kRows) {
#pragma unroll
        for (int r = 0; r < kRows; ++r) row(r);
      } else {
        for (std::int64_t r = 0; r < nb; ++r) row(r);
      }
      bdy[ch * blocks + b] = sum;
      bdyx[ch * blocks + b] = sx;
    }
    __syncthreads();
  }
}

template <class Acc>
__global__ void grad_finalize_kernel(const Acc* __restrict__ bdy, const Acc* __restrict__ bdyx, std::int64_t n,
                                     std::int64_t c, Acc* __restrict__ dgamma, Acc* __restrict__ dbeta,
                                     Acc* __restrict__ k1, Acc* __restrict__ k2) {
  const int lane = static_cast<int>(threadIdx.x % bn::kLanes);
  const std::int64_t blocks = bn::block_count(n);
  for (std::int64_t ch = warp_id(); ch < c; ch += warp_count()) {  // warp-uniform loop
    double s = lane_sum(lane, blocks, [&](std::int64_t b) { return static_cast<double>(bdy[ch * blocks + b]); });
    double sx = lane_sum(lane, blocks, [&](std::int64_t b) { return static_cast<double>(bdyx[ch * blocks + b]); });
    s = warp_tree(s);
    sx = warp_tree(sx);
    if (lane == 0) {
      if (dgamma) dgamma[ch] = static_cast<Acc>(sx);
      if (dbeta) dbeta[ch] = static_cast<Acc>(s);
      k1[ch] = n > 0 ? static_cast<Acc>(s / static_cast<double>(n)) : Acc(0);
      k2[ch] = n > 0 ? static_cast<Acc>(sx / static_cast<double>(n)) : Acc(0);
    }
  }
}

template <class T, int V>
__global__ void grad_input_kernel(const T* __restrict__ x, const T* __restrict__ dy, const T* __restrict__ ys,
                                  bool relu, bool training, std::int64_t n, std::int64_t c, std::int64_t rows_per_pass,
                                  const Accum<T>* __restrict__ gamma, const Accum<T>* __restrict__ mean,
                                  const Accum<T>* __restrict__ invstd, const Accum<T>* __restrict__ k1,
                                  const Accum<T>* __restrict__ k2, T* __restrict__ dx, T* __restrict__ dres) {
  using Acc = Accum<T>;
  const std::int64_t cv = c / V;
  const std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (t >= rows_per_pass * cv) return;
  const std::int64_t row0 = t / cv, ch0 = (t - row0 * cv) * V;
  Acc is[V], scale[V], mu[V], a1[V], a2[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    is[j] = invstd[ch0 + j];
    scale[j] = gamma ? gamma[ch0 + j] * is[j] : is[j];
    mu[j] = mean[ch0 + j];
    a1[j] = training ? k1[ch0 + j] : Acc(0);
    a2[j] = training ? k2[ch0 + j] : Acc(0);
  }
  const T* ysp = relu ? ys : dy;
  const T* xp = training ? x : dy;  // eval reads no x
#pragma unroll 2
  for (std::int64_t r = row0; r < n; r += rows_per_pass) {
    const std::int64_t i = r * c + ch0;
    Acc g[V];
    const Pack<T, V> dk = load_pack<V>(dy + i);
    const Pack<T, V> yk = load_pack<V>(ysp + i);
    masked_grad<T, V>(dk, yk, relu, g);
    if (dres) {  // the residual's gradient (relu only): dy where the output is positive, else 0
      Pack<T, V> q;
#pragma unroll
      for (int j = 0; j < V; ++j) q.v[j] = fast_load(yk.v[j]) > Acc(0) ? dk.v[j] : dev_store<T>(Acc(0));
      *reinterpret_cast<Pack<T, V>*>(dres + i) = q;
    }
    if (!dx) continue;
    const Pack<T, V> xk = load_pack<V>(xp + i);
    Pack<T, V> o;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      if (training) {
        const Acc xhat = (fast_load(xk.v[j]) - mu[j]) * is[j];
        o.v[j] = dev_store<T>(scale[j] * (g[j] - a1[j] - bn::mul(xhat, a2[j])));
      } else {
        o.v[j] = dev_store<T>(scale[j] * g[j]);
      }
    }
    *reinterpret_cast<Pack<T, V>*>(dx + i) = o;
  }
}

// Launches f(std::integral_constant<int, V>) for the runtime width v.
template <class T, class F>
void with_width(int v, F&& f) {
  if constexpr (16 / sizeof(T) >= 8) {
    if (v == 8) return f(std::integral_constant<int, 8>{});
  }
  if (v == 4) return f(std::integral_constant<int, 4>{});
  if (v == 2) return f(std::integral_constant<int, 2>{});
  return f(std::integral_constant<int, 1>{});
}

template <class T>
void forward_typed(const BatchNormArgs& a) {
  using Acc = Accum<T>;
  const cudaStream_t s = stream_of(a.device);
  const std::int64_t n = a.n, c = a.c;
  if (c == 0) return;
  Acc* mean = static_cast<Acc*>(a.mean);
  Acc* invstd = static_cast<Acc*>(a.invstd);
  Acc* rm = static_cast<Acc*>(a.running_mean);
  Acc* rv = static_cast<Acc*>(a.running_var);
  Array scratch;  // kept alive to the end of the call (the allocator orders its release on s)
  if (a.training) {
    const std::int64_t parts = bn::block_count(n) * c;
    scratch = Array::empty({2 * (parts > 0 ? parts : 1)}, dtype_of<Acc>(), a.device);
    Acc* bmean = scratch.data<Acc>();
    Acc* bm2 = bmean + parts;
    if (parts > 0) {
      const TilePlan tp = tile_plan(n, c, sizeof(T), 1);
      if (tp.blocks_per_tile > 0) {
        moments_tiled<T><<<tile_grid(tp.tiles), kTileThreads, tp.smem, s>>>(
            static_cast<const T*>(a.x), n, c, tp.blocks_per_tile, aligned16({a.x}), bmean, bm2);
      } else {
        moments_kernel<T><<<grid_for(parts), kThreads, 0, s>>>(static_cast<const T*>(a.x), n, c, bmean, bm2);
      }
      LATTICE_CUDA_CHECK_LAUNCH();
    }
    finalize_kernel<Acc><<<grid_for(c * bn::kLanes), kThreads, 0, s>>>(bmean, bm2, n, c, a.eps, a.momentum, mean, invstd, rm, rv);
    LATTICE_CUDA_CHECK_LAUNCH();
  } else {
    eval_stats_kernel<Acc><<<grid_for(c), kThreads, 0, s>>>(rm, rv, c, a.eps, mean, invstd);
    LATTICE_CUDA_CHECK_LAUNCH();
  }
  if (n == 0) return;
  with_width<T>(pack_width<T>(c, {a.x, a.y, a.residual}), [&](auto w) {
    constexpr int V = decltype(w)::value;
    const ChannelGrid g = channel_grid(n, c / V);
    normalize_kernel<T, V><<<g.blocks, kThreads, 0, s>>>(
        static_cast<const T*>(a.x), static_cast<T*>(a.y), n, c, g.rows_per_pass, mean, invstd,
        static_cast<const Acc*>(a.gamma), static_cast<const Acc*>(a.beta), a.relu,
        static_cast<const T*>(a.residual));
  });
  LATTICE_CUDA_CHECK_LAUNCH();
}

template <class T>
void backward_typed(const BatchNormArgs& a) {
  using Acc = Accum<T>;
  const cudaStream_t s = stream_of(a.device);
  const std::int64_t n = a.n, c = a.c;
  if (c == 0) return;
  const T* x = static_cast<const T*>(a.x);
  const T* dy = static_cast<const T*>(a.dy);
  const T* ys = static_cast<const T*>(a.y_saved);
  const Acc* mean = static_cast<const Acc*>(a.mean);
  const Acc* invstd = static_cast<const Acc*>(a.invstd);
  const bool need_sums = a.dgamma || (a.dx && a.training);
  Array scratch;
  Acc* k1 = nullptr;
  Acc* k2 = nullptr;
  if (need_sums) {
    const std::int64_t parts = bn::block_count(n) * c;
    scratch = Array::empty({2 * parts + 2 * c}, dtype_of<Acc>(), a.device);
    Acc* bdy = scratch.data<Acc>();
    Acc* bdyx = bdy + parts;
    k1 = bdyx + parts;
    k2 = k1 + c;
    if (parts > 0) {
      const TilePlan tp = tile_plan(n, c, sizeof(T), a.relu ? 3 : 2);
      if (tp.blocks_per_tile > 0) {
        const bool vec = aligned16({x, dy, a.relu ? ys : nullptr});
        if (a.relu)
          grad_sums_tiled<T, true><<<tile_grid(tp.tiles), kTileThreads, tp.smem, s>>>(
              x, dy, ys, n, c, tp.blocks_per_tile, vec, mean, invstd, bdy, bdyx);
        else
          grad_sums_tiled<T, false><<<tile_grid(tp.tiles), kTileThreads, tp.smem, s>>>(
              x, dy, ys, n, c, tp.blocks_per_tile, vec, mean, invstd, bdy, bdyx);
      } else {
        grad_sums_kernel<T><<<grid_for(parts), kThreads, 0, s>>>(x, dy, ys, a.relu, n, c, mean, invstd, bdy, bdyx);
      }
      LATTICE_CUDA_CHECK_LAUNCH();
    }
    grad_finalize_kernel<Acc><<<grid_for(c * bn::kLanes), kThreads, 0, s>>>(bdy, bdyx, n, c, static_cast<Acc*>(a.dgamma),
                                                                static_cast<Acc*>(a.dbeta), k1, k2);
    LATTICE_CUDA_CHECK_LAUNCH();
  }
  // The residual's gradient (dy masked by the output) comes from the same pass; the semantic
  // layer asks for it only with the ReLU (without, it is dy itself).
  LATTICE_ASSERT(!a.dresidual || a.relu, "batch_norm cuda backward: a residual gradient without the ReLU");
  if ((!a.dx && !a.dresidual) || n == 0) return;
  const bool training = a.training && a.dx;  // k1 / k2 exist when dx is asked for in training
  with_width<T>(pack_width<T>(c, {dy, a.dx, a.dresidual, a.relu ? ys : nullptr, training ? x : nullptr}), [&](auto w) {
    constexpr int V = decltype(w)::value;
    const ChannelGrid g = channel_grid(n, c / V);
    grad_input_kernel<T, V><<<g.blocks, kThreads, 0, s>>>(x, dy, ys, a.relu, training, n, c, g.rows_per_pass,
                                                          static_cast<const Acc*>(a.gamma), mean, invstd, k1, k2,
                                                          static_cast<T*>(a.dx), static_cast<T*>(a.dresidual));
  });
  LATTICE_CUDA_CHECK_LAUNCH();
}

template <class F>
void dispatch(Dtype dtype, F&& f) {
  switch (dtype) {
    case Dtype::f16: return f(TypeTag<Half>{});
    case Dtype::bf16: return f(TypeTag<BFloat16>{});
    case Dtype::f32: return f(TypeTag<float>{});
    case Dtype::f64: return f(TypeTag<double>{});
    default: throw_unsupported_dtype("batch_norm", "input", dtype, "float16, bfloat16, float32 or float64");
  }
}

}  // namespace

void batch_norm_cuda_forward(const BatchNormArgs& a) {
  DeviceGuard guard(a.device.index);
  dispatch(a.dtype, [&](auto tag) { forward_typed<typename decltype(tag)::type>(a); });
}

void batch_norm_cuda_backward(const BatchNormArgs& a) {
  DeviceGuard guard(a.device.index);
  dispatch(a.dtype, [&](auto tag) { backward_typed<typename decltype(tag)::type>(a); });
}

}  // namespace lattice::backend::cuda

LATTICE_ROUTE_KERNELS(BatchNormKernels, batch_norm_cuda, {
    .forward = cuda::batch_norm_cuda_forward,
    .backward = cuda::batch_norm_cuda_backward});
