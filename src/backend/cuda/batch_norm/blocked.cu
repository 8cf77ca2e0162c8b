// Constraints: CUDA (data on a cuda device, the CUDA backend built and a device present);
// features (N, C) of any float dtype (f16, bf16, f32, f64) with per-channel parameters and
// statistics in f32 (f64 for f64 features); any N (N >= 2 in training, checked by the
// semantic layer), including none, any C; training and eval, forward and backward, optional
// fused ReLU. Deterministic: fixed blocks of 32 rows reduced per (block, channel) in
// row order, their partials summed in double in a fixed order by one warp per channel (no
// atomics), so results are bitwise the same run to run and for any grid; the same order and
// arithmetic as the CPU parallel route.
//
// The reduction order is backend/common/batch_norm.h's, the same as the CPU `parallel` route's
// (and its arithmetic, with products kept out of FMAs: batch_norm::mul), so the two routes
// normally agree bit for bit; the tests compare them within rounding. Three launches per pass,
// all on the current stream of the args' device:
//   forward, training: moments (one thread per (32-row block, channel): the block's mean, then
//     its M2, reading the block's rows twice, the second time from cache; partials stored
//     channel-major) -> finalize (one warp per channel: lane l sums blocks l, l + 32, ... in
//     order, in double, then a shfl_down tree: mean, then M2; invstd, running statistics) ->
//     normalize (one channel per thread, striding over the rows: channel_grid).
//   forward, eval: eval_stats (one thread per channel) -> normalize.
//   backward: grad_sums (per (block, channel): sum dy', sum dy' * xhat) -> grad_finalize (one
//     warp per channel; dgamma, dbeta, the means k1, k2) -> grad_input (elementwise dx, one
//     channel per thread as normalize). Full 32-row blocks load their rows ahead of the in-order
//     sums (registers), which keeps the loads in flight without changing any sum's order. Eval
//     without dgamma: grad_input only.
// Consecutive threads take consecutive channels of one row, so loads are coalesced for C >= 32.
// Scratch (the block partials) comes from the stream-ordered allocator (Array::empty).
#include <cuda_runtime.h>

#include <cstdint>

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
      for (int r = 0; r < kRows; ++r) v[r] = dev_load(p[r * c]);
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
      for (std::int64_t r = 0; r < nb; ++r) s += dev_load(p[r * c]);
      m = s / static_cast<Acc>(nb);
      for (std::int64_t r = 0; r < nb; ++r) {
        const Acc d = dev_load(p[r * c]) - m;
        m2 += bn::mul(d, d);
      }
    }
    const std::int64_t blocks = total / c;
    bmean[ch * blocks + b] = m;
    bm2[ch * blocks + b] = m2;
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

template <class Acc>
__global__ void finalize_kernel(const Acc* __restrict__ bmean, const Acc* __restrict__ bm2, std::int64_t n,
                                std::int64_t c, double eps, double momentum, Acc* __restrict__ mean,
                                Acc* __restrict__ invstd, Acc* __restrict__ rm, Acc* __restrict__ rv) {
  const int lane = static_cast<int>(threadIdx.x % bn::kLanes);
  const std::int64_t blocks = bn::block_count(n);
  for (std::int64_t ch = warp_id(); ch < c; ch += warp_count()) {  // warp-uniform loop
    double s = 0.0;
    for (std::int64_t b = lane; b < blocks; b += bn::kLanes) s += bn::mean_term(bmean, n, blocks, ch, b);
    s = warp_tree(s);
    const double m = n > 0 ? __shfl_sync(0xffffffffu, s, 0) / static_cast<double>(n) : 0.0;
    double q = 0.0;
    for (std::int64_t b = lane; b < blocks; b += bn::kLanes) q += bn::m2_term(bmean, bm2, n, blocks, ch, b, m);
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

// The elementwise kernels (normalize, grad_input) give each thread one channel for the whole
// pass: thread t of a grid of rows_per_pass * c threads takes channel t % c and the rows
// t / c, t / c + rows_per_pass, ... (consecutive threads still read consecutive channels of one
// row), so the per-channel factors are loaded once and no element pays a 64-bit modulo. The
// arithmetic per element is unchanged (same bits as one thread per element).
struct ChannelGrid {
  std::int64_t rows_per_pass;
  unsigned blocks;
};

ChannelGrid channel_grid(std::int64_t n, std::int64_t c) {
  constexpr std::int64_t kTargetThreads = 1 << 17;  // ~ a full H100 / H200 wave of 256-thread blocks
  std::int64_t rows = kTargetThreads / c;
  if (rows < 1) rows = 1;
  if (rows > n) rows = n;
  const std::int64_t threads = rows * c;
  const std::int64_t b = (threads + kThreads - 1) / kThreads;
  return {rows, static_cast<unsigned>(b < 1 ? 1 : (b > 2147483647 ? 2147483647 : b))};
}

template <class T>
__global__ void normalize_kernel(const T* __restrict__ x, T* __restrict__ y, std::int64_t n, std::int64_t c,
                                 std::int64_t rows_per_pass, const Accum<T>* __restrict__ mean,
                                 const Accum<T>* __restrict__ invstd, const Accum<T>* __restrict__ gamma,
                                 const Accum<T>* __restrict__ beta, bool relu) {
  using Acc = Accum<T>;
  const std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (t >= rows_per_pass * c) return;
  const std::int64_t ch = t % c;
  const Acc scale = gamma ? gamma[ch] * invstd[ch] : invstd[ch];
  const Acc shift = beta ? beta[ch] : Acc(0);
  const Acc mu = mean[ch];
  const std::int64_t step = rows_per_pass * c;
  for (std::int64_t i = t; i < n * c; i += step) {
    Acc v = bn::mul(dev_load(x[i]) - mu, scale) + shift;
    if (relu) v = relu_acc(v);
    y[i] = dev_store<T>(v);
  }
}

// dy' of element i: dy masked by the forward's output when the ReLU was fused.
template <class T>
__device__ inline Accum<T> masked_grad(const T* dy, const T* ys, bool relu, std::int64_t i) {
  using Acc = Accum<T>;
  if (relu && !(dev_load(ys[i]) > Acc(0))) return Acc(0);
  return dev_load(dy[i]);
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
          xv[r] = dev_load(x[i]);
          gv[r] = masked_grad(dy, ys, relu, i);
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
        const Acc g = masked_grad(dy, ys, relu, i);
        const Acc xhat = (dev_load(x[i]) - m) * is;
        s += g;
        sx += bn::mul(g, xhat);
      }
    }
    const std::int64_t blocks = total / c;
    bdy[ch * blocks + b] = s;
    bdyx[ch * blocks + b] = sx;
  }
}

template <class Acc>
__global__ void grad_finalize_kernel(const Acc* __restrict__ bdy, const Acc* __restrict__ bdyx, std::int64_t n,
                                     std::int64_t c, Acc* __restrict__ dgamma, Acc* __restrict__ dbeta,
                                     Acc* __restrict__ k1, Acc* __restrict__ k2) {
  const int lane = static_cast<int>(threadIdx.x % bn::kLanes);
  const std::int64_t blocks = bn::block_count(n);
  for (std::int64_t ch = warp_id(); ch < c; ch += warp_count()) {  // warp-uniform loop
    double s = 0.0, sx = 0.0;
    for (std::int64_t b = lane; b < blocks; b += bn::kLanes) {
      s += static_cast<double>(bdy[ch * blocks + b]);
      sx += static_cast<double>(bdyx[ch * blocks + b]);
    }
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

template <class T>
__global__ void grad_input_kernel(const T* __restrict__ x, const T* __restrict__ dy, const T* __restrict__ ys,
                                  bool relu, bool training, std::int64_t n, std::int64_t c, std::int64_t rows_per_pass,
                                  const Accum<T>* __restrict__ gamma, const Accum<T>* __restrict__ mean,
                                  const Accum<T>* __restrict__ invstd, const Accum<T>* __restrict__ k1,
                                  const Accum<T>* __restrict__ k2, T* __restrict__ dx) {
  using Acc = Accum<T>;
  const std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (t >= rows_per_pass * c) return;
  const std::int64_t ch = t % c;
  const Acc is = invstd[ch];
  const Acc scale = gamma ? gamma[ch] * is : is;
  const Acc mu = mean[ch];
  const Acc a1 = training ? k1[ch] : Acc(0), a2 = training ? k2[ch] : Acc(0);
  const std::int64_t step = rows_per_pass * c;
  for (std::int64_t i = t; i < n * c; i += step) {
    const Acc g = masked_grad(dy, ys, relu, i);
    if (training) {
      const Acc xhat = (dev_load(x[i]) - mu) * is;
      dx[i] = dev_store<T>(scale * (g - a1 - bn::mul(xhat, a2)));
    } else {
      dx[i] = dev_store<T>(scale * g);
    }
  }
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
      moments_kernel<T><<<grid_for(parts), kThreads, 0, s>>>(static_cast<const T*>(a.x), n, c, bmean, bm2);
      LATTICE_CUDA_CHECK_LAUNCH();
    }
    finalize_kernel<Acc><<<grid_for(c * bn::kLanes), kThreads, 0, s>>>(bmean, bm2, n, c, a.eps, a.momentum, mean, invstd, rm, rv);
    LATTICE_CUDA_CHECK_LAUNCH();
  } else {
    eval_stats_kernel<Acc><<<grid_for(c), kThreads, 0, s>>>(rm, rv, c, a.eps, mean, invstd);
    LATTICE_CUDA_CHECK_LAUNCH();
  }
  if (n == 0) return;
  const ChannelGrid g = channel_grid(n, c);
  normalize_kernel<T><<<g.blocks, kThreads, 0, s>>>(
      static_cast<const T*>(a.x), static_cast<T*>(a.y), n, c, g.rows_per_pass, mean, invstd,
      static_cast<const Acc*>(a.gamma), static_cast<const Acc*>(a.beta), a.relu);
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
      grad_sums_kernel<T><<<grid_for(parts), kThreads, 0, s>>>(x, dy, ys, a.relu, n, c, mean, invstd, bdy, bdyx);
      LATTICE_CUDA_CHECK_LAUNCH();
    }
    grad_finalize_kernel<Acc><<<grid_for(c * bn::kLanes), kThreads, 0, s>>>(bdy, bdyx, n, c, static_cast<Acc*>(a.dgamma),
                                                                static_cast<Acc*>(a.dbeta), k1, k2);
    LATTICE_CUDA_CHECK_LAUNCH();
  }
  if (!a.dx || n == 0) return;
  const ChannelGrid g = channel_grid(n, c);
  grad_input_kernel<T><<<g.blocks, kThreads, 0, s>>>(x, dy, ys, a.relu, a.training, n, c, g.rows_per_pass,
                                                      static_cast<const Acc*>(a.gamma), mean, invstd, k1, k2,
                                                      static_cast<T*>(a.dx));
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
