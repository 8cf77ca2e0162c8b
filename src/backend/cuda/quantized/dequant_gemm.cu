// Constraints: CUDA device (any tier, classic or above); float32, float16 or bfloat16
// activations; any relation kind (and linear: rows times W, no relation), any kernel volume, any
// edge count (n_out = 0 and rows without edges included), any channel counts (tiles guarded, no
// multiple-of-tile or multiple-of-group requirement); bits 4 / 8, group 32 / 64 / 128, scales
// f16 / bf16 / f32. Forward only. Deterministic: bitwise-identical results for the same inputs,
// device and build (no atomics).
//
// Implicit GEMM with the packed weight dequantized inside the kernel (SIMT, f32 accumulation):
// a thread block of 256 threads owns an output tile of 64 destination rows x 64 output
// channels (each thread a 4 x 4 piece) and walks the kernel offsets k in ascending order. For
// each offset it reads the tile's column k of the relation's N_out x K gemm_map (source row or
// -1; linear and 1x1x1 identity relations use the row itself, no map) and skips the offset when
// no row of the tile has it; otherwise it loops over the input channels in steps of 16: A = the
// gathered source rows (-1 -> zeros) widened to f32, B = the (16 x 64) slice of W[k] decoded
// from the packed words with its group's scale and bias (decode.cuh: the exact values
// dequantize_weight() gives, rounded to the activation dtype) into shared memory, then 16
// rank-1 updates of the f32 accumulators. No dequantized copy of W exists outside shared
// memory; decoding costs one word + scale + bias read per weight element and row tile.
// The accumulators start at the bias; each output element is rounded to the activation dtype
// once, at the end. Summation order (offsets ascending, channels ascending, sequential per
// element) is fixed by the data, so repeated runs give the same bits.
//
// Shapes (K = kernel volume, W = C_in_st*bits/32): x (n_in, C_in), y (n_out, C_out), bias
//   (C_out) or null, all of the activation dtype; packed / scales / biases as
//   QuantizedWeightArgs. Buffers: the N_out x K map (int32) when the view carries none.
#include <cstdint>

#include "backend/cuda/common/conv_support.cuh"
#include "backend/cuda/quantized/decode.cuh"
#include "backend/cuda/quantized/quantized_routes.h"
#include "backend/cuda/runtime/check.h"
#include "backend/cuda/runtime/stream.h"
#include "backend/kernels.h"
#include "lattice/core/error.h"

namespace lattice::backend::cuda {
namespace {

using qdetail::PackedWeight;

constexpr int kBM = 64;        // tile rows (destination rows)
constexpr int kBN = 64;        // tile columns (output channels)
constexpr int kBK = 16;        // reduction step (input channels)
constexpr int kThreads = 256;  // 16 x 16 threads, each rows ty + 16 i, columns tx + 16 j (i, j < 4)

// y (n_out, C_out) = round(bias + sum_k gather_{map[:, k]}(x) @ W[k]); map null: row r reads x[r]
// (kernel_volume 1). kernel_volume 0: y = bias (no edges).
template <class T, class S>
__global__ void __launch_bounds__(kThreads)
    dequant_gemm_kernel(const std::int32_t* __restrict__ map, std::int64_t n_out, std::int64_t kernel_volume,
                        const T* __restrict__ x, PackedWeight w, const T* __restrict__ bias, T* __restrict__ y) {
  __shared__ float as[kBK][kBM + 1];
  __shared__ float bs[kBK][kBN + 1];
  __shared__ std::int32_t rows[kBM];

  const int tid = threadIdx.x;
  const int tx = tid % 16, ty = tid / 16;
  const std::int64_t row0 = static_cast<std::int64_t>(blockIdx.x) * kBM;
  const std::int64_t col0 = static_cast<std::int64_t>(blockIdx.y) * kBN;
  const std::int64_t c_in = w.c_in, c_out = w.c_out;

  float acc[4][4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const std::int64_t co = col0 + tx + 16 * j;
    const float b0 = (bias != nullptr && co < c_out) ? dev_load(bias[co]) : 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i][j] = b0;
  }

  for (std::int64_t k = 0; k < kernel_volume; ++k) {
    int has = 0;
    if (tid < kBM) {
      const std::int64_t r = row0 + tid;
      std::int32_t v = -1;
      if (r < n_out) v = map != nullptr ? map[r * kernel_volume + k] : static_cast<std::int32_t>(r);
      rows[tid] = v;
      has = v >= 0;
    }
    if (!__syncthreads_or(has)) continue;  // no row of the tile has offset k (uniform per block)
    for (std::int64_t c0 = 0; c0 < c_in; c0 += kBK) {
      // A: consecutive threads read consecutive channels of one source row.
      for (int idx = tid; idx < kBM * kBK; idx += kThreads) {
        const int r = idx / kBK, c = idx % kBK;
        const std::int32_t v = rows[r];
        const std::int64_t ch = c0 + c;
        as[c][r] = (v >= 0 && ch < c_in) ? dev_load(x[static_cast<std::int64_t>(v) * c_in + ch]) : 0.0f;
      }
      // B: consecutive threads walk the contiguous direction of the packed storage (C_out for
      // kernel-major weights, C_in for linear's by-output rows).
      for (int idx = tid; idx < kBK * kBN; idx += kThreads) {
        const int r = w.by_output ? idx % kBK : idx / kBN;
        const int c = w.by_output ? idx / kBK : idx % kBN;
        const std::int64_t ch = c0 + r, co = col0 + c;
        bs[r][c] = (ch < c_in && co < c_out) ? qdetail::decode<T, S>(w, k, ch, co) : 0.0f;
      }
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < kBK; ++kk) {
        float a[4], b[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) a[i] = as[kk][ty + 16 * i];
#pragma unroll
        for (int j = 0; j < 4; ++j) b[j] = bs[kk][tx + 16 * j];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
      }
      __syncthreads();
    }
  }

#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const std::int64_t row = row0 + ty + 16 * i;
    if (row >= n_out) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const std::int64_t co = col0 + tx + 16 * j;
      if (co < c_out) y[row * c_out + co] = dev_store<T>(acc[i][j]);
    }
  }
}

std::int64_t tiles(std::int64_t n, std::int64_t tile) { return (n + tile - 1) / tile; }

template <class T, class S>
void forward(const QuantizedConvArgs& a) {
  const RelationView& rel = a.rel;
  const QuantizedWeightArgs& wa = a.w;
  LATTICE_ASSERT(a.device.is_cuda(), "quantized cuda_dequant_gemm: arrays are not on a CUDA device");
  if (rel.n_out == 0 || wa.c_out == 0) return;
  DeviceGuard guard(a.device.index);
  cudaStream_t s = stream_of(a.device);
  const bool identity = rel.identity && rel.kernel_volume == 1;
  Array built;
  const std::int32_t* map = nullptr;
  std::int64_t kernel_volume = rel.kernel_volume;
  if (identity) {
    LATTICE_ASSERT(rel.n_in == rel.n_out, "quantized cuda_dequant_gemm: identity relation with n_in != n_out");
  } else if (rel.n_edges == 0) {
    kernel_volume = 0;  // no edges: every output row is the bias
  } else {
    map = rel.gemm_map;
    if (map == nullptr) {
      LATTICE_ASSERT(rel.in_idx && rel.out_idx && rel.k_idx,
                     "quantized cuda_dequant_gemm: edge list (in_idx, out_idx, k_idx) is null");
      built = build_edge_map(rel.out_idx, rel.in_idx, rel.k_idx, rel.n_edges, rel.n_out, rel.kernel_volume, a.device);
      map = built.data<std::int32_t>();
    }
  }
  const std::int64_t rt = tiles(rel.n_out, kBM), ct = tiles(wa.c_out, kBN);
  LATTICE_ASSERT(rt <= 2147483647 && ct <= 65535, "quantized cuda_dequant_gemm: problem too large for the grid");
  dequant_gemm_kernel<T, S><<<dim3(static_cast<unsigned>(rt), static_cast<unsigned>(ct)), kThreads, 0, s>>>(
      map, rel.n_out, kernel_volume, static_cast<const T*>(a.x), qdetail::packed_weight(wa),
      static_cast<const T*>(a.bias), static_cast<T*>(a.y));
  LATTICE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void quantized_cuda_dequant_gemm_forward(const QuantizedConvArgs& args) {
  constexpr const char* op = "quantized cuda_dequant_gemm";
  const auto run = [&](auto t_tag) {
    using T = typename decltype(t_tag)::type;
    qdetail::dispatch_scale(args.w.scale_dtype, op, [&](auto s_tag) {
      forward<T, typename decltype(s_tag)::type>(args);
    });
  };
  switch (args.dtype) {
    case Dtype::f32: run(TypeTag<float>{}); return;
    case Dtype::f16: run(TypeTag<Half>{}); return;
    case Dtype::bf16: run(TypeTag<BFloat16>{}); return;
    default:
      throw UnsupportedError(std::string("[") + op + "] dtype: expected float16, bfloat16 or float32, got " +
                             std::string(to_string(args.dtype)));
  }
}

}  // namespace lattice::backend::cuda

LATTICE_ROUTE_KERNELS(QuantizedKernels, quantized_cuda_dequant_gemm, {
    .dequantize = cuda::quantized_cuda_dequantize,
    .forward = cuda::quantized_cuda_dequant_gemm_forward});
