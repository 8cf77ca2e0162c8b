// Constraints: CUDA device (any tier, classic or above); kernel volume 1; identity relation
// (edges exactly (i, i, 0) for every row, so n_in == n_out); f16, bf16 or f32 (f32 GEMMs use
// tf32 only with allow_tf32). Deterministic: bitwise-identical results for the same inputs,
// device and build.
//
// A 1x1x1 convolution at stride 1 without padding or target is a matmul over rows
// (SEMANTICS.md "Convolution"), so each pass is one cuBLAS GEMM on the caller's stream, reading
// no relation view at all (the MinkUNet shortcuts and the 1x1 heads: the implicit GEMM spent a
// 64-row tile grid, a map and a launch on each of them, docs/performance.md).
//
// Shapes (N = n_in = n_out): x (N, C_in), w (1, C_in, C_out), bias (C_out) or null, y (N, C_out),
// dy (N, C_out), dx (N, C_in), dw (1, C_in, C_out); all of the storage dtype T.
//   forward     y  = x @ W[0] + bias
//   input_grad  dx = dy @ W[0]^T
//   weight_grad dw[0] = x^T @ dy
// Numerics: cublasGemmEx with T inputs and T output, CUBLAS_COMPUTE_32F (f32 accumulation;
// CUBLAS_COMPUTE_32F_FAST_TF32 for f32 with allow_tf32, whose operands are first rounded to the
// nearest tf32 value in copies, as in cuda_gather_gemm_scatter, so the result does not depend on
// how the tensor cores convert f32). The bias enters as beta * C with C the bias broadcast in T
// (exact), so each element is alpha * sum + bias in f32, rounded to T once. Rows beyond INT_MAX
// are cut into chunks (independent rows for the forward and input gradient; for the weight
// gradient an f32 accumulator over the chunks, rounded once at the end).
// Determinism: cuBLAS runs with a fixed workspace (bind_cublas), atomics disallowed (its
// default), on one stream, which makes its GEMMs reproducible on one device.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/common/conv_support.cuh"
#include "backend/cuda/runtime/check.h"
#include "backend/cuda/runtime/stream.h"
#include "backend/kernels.h"
#include "lattice/core/error.h"

namespace lattice::backend::cuda {
namespace {

// The largest row count one GEMM takes (an int dimension, a multiple of 16 so chunks stay aligned).
constexpr std::int64_t kMaxRows = std::int64_t{1} << 30;
constexpr const char* kRoute = "conv cuda_pointwise_matmul";

void check_pointwise(const ConvArgs& a) {
  LATTICE_ASSERT(a.rel.kernel_volume == 1 && a.rel.identity && a.rel.n_in == a.rel.n_out,
                 "conv cuda_pointwise_matmul: requires kernel volume 1 and the identity relation");
}

template <class E>
__global__ void broadcast_rows_kernel(E* y, std::int64_t rows, std::int64_t c, const E* bias) {
  const std::int64_t n = rows * c;
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x)
    y[i] = bias ? bias[i % c] : E(0.0f);
}

// y (rows, c) = bias broadcast, or zeros.
template <class E>
void broadcast_rows(E* y, std::int64_t rows, std::int64_t c, const E* bias, cudaStream_t s) {
  const std::int64_t n = rows * c;
  if (n == 0) return;
  const int threads = 256;
  const std::int64_t blocks = std::min<std::int64_t>((n + threads - 1) / threads, 65535);
  broadcast_rows_kernel<E><<<static_cast<unsigned>(blocks), threads, 0, s>>>(y, rows, c, bias);
  LATTICE_CUDA_CHECK_LAUNCH();
}

// dst (n, c_dst) = src (n, c_src) @ op(W) + beta * dst over the N rows, in chunks of kMaxRows:
// op(W) = W (C_in, C_out) for the forward (src x), W^T for the input gradient (src dy). In
// column-major terms dst^T = op'(W) @ src^T with W's row-major storage read as W^T (lda C_out).
template <class E>
void rows_times_weight(const ConvArgs& a, const void* src_v, std::int64_t c_src, bool transpose_w, float beta, E* dst,
                       std::int64_t c_dst, cudaStream_t s) {
  const std::int64_t n = a.rel.n_out;
  Array keep_src, keep_w;
  const E* src = tf32_operand<E>(a, src_v, n * c_src, s, keep_src);
  const E* w = tf32_operand<E>(a, a.w, a.c_in * a.c_out, s, keep_w);
  const CublasBinding cb = bind_cublas(a.device);
  for (std::int64_t r0 = 0; r0 < n; r0 += kMaxRows) {
    const std::int64_t m = std::min(kMaxRows, n - r0);
    cublas_gemm<E, E>(cb, uses_tf32<E>(a), transpose_w ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, c_dst, m, c_src, w,
                      a.c_out, src + r0 * c_src, c_src, beta, dst + r0 * c_dst, c_dst, kRoute);
  }
}

template <class E>
void forward(const ConvArgs& a) {
  check_pointwise(a);
  DeviceGuard guard(a.device.index);
  cudaStream_t s = stream_of(a.device);
  const std::int64_t n = a.rel.n_out;
  if (n * a.c_out == 0) return;
  auto* y = static_cast<E*>(a.y);
  const auto* bias = static_cast<const E*>(a.bias);
  if (bias || a.c_in == 0) broadcast_rows<E>(y, n, a.c_out, bias, s);
  if (a.c_in == 0) return;
  rows_times_weight<E>(a, a.x, a.c_in, false, bias ? 1.0f : 0.0f, y, a.c_out, s);
}

template <class E>
void input_grad(const ConvArgs& a) {
  check_pointwise(a);
  DeviceGuard guard(a.device.index);
  cudaStream_t s = stream_of(a.device);
  const std::int64_t n = a.rel.n_in;
  if (n * a.c_in == 0) return;
  auto* dx = static_cast<E*>(a.dx);
  if (a.c_out == 0) {
    broadcast_rows<E>(dx, n, a.c_in, nullptr, s);
    return;
  }
  rows_times_weight<E>(a, a.dy, a.c_out, true, 0.0f, dx, a.c_in, s);
}

template <class E>
void weight_grad(const ConvArgs& a) {
  check_pointwise(a);
  DeviceGuard guard(a.device.index);
  cudaStream_t s = stream_of(a.device);
  const std::int64_t n = a.rel.n_in, per = a.c_in * a.c_out;
  if (per == 0) return;
  auto* dw = static_cast<E*>(a.dw);
  if (n == 0) {
    broadcast_rows<E>(dw, a.c_in, a.c_out, nullptr, s);
    return;
  }
  Array keep_x, keep_dy;
  const E* x = tf32_operand<E>(a, a.x, n * a.c_in, s, keep_x);
  const E* dy = tf32_operand<E>(a, a.dy, n * a.c_out, s, keep_dy);
  const CublasBinding cb = bind_cublas(a.device);
  // dW^T (C_out, C_in) col-major = dY^T (C_out, m) @ X (m, C_in): row-major dW.
  if (n <= kMaxRows) {
    cublas_gemm<E, E>(cb, uses_tf32<E>(a), CUBLAS_OP_N, CUBLAS_OP_T, a.c_out, a.c_in, n, dy, a.c_out, x, a.c_in, 0.0f,
                      dw, a.c_out, kRoute);
    return;
  }
  Array acc_buf;
  float* acc = nullptr;
  if constexpr (std::is_same_v<E, float>) {
    acc = dw;
  } else {
    acc_buf = Array::empty({a.c_in, a.c_out}, Dtype::f32, a.device);
    acc = acc_buf.data<float>();
  }
  for (std::int64_t r0 = 0; r0 < n; r0 += kMaxRows) {
    const std::int64_t m = std::min(kMaxRows, n - r0);
    cublas_gemm<E, float>(cb, uses_tf32<E>(a), CUBLAS_OP_N, CUBLAS_OP_T, a.c_out, a.c_in, m, dy + r0 * a.c_out,
                          a.c_out, x + r0 * a.c_in, a.c_in, r0 == 0 ? 0.0f : 1.0f, acc, a.c_out, kRoute);
  }
  if constexpr (!std::is_same_v<E, float>) round_to<E>(acc, dw, per, s);
}

}  // namespace

void conv_cuda_pointwise_matmul_forward(const ConvArgs& args) {
  dispatch_conv_dtype(args.dtype, "conv cuda_pointwise_matmul",
                      [&](auto tag) { forward<typename decltype(tag)::type>(args); });
}

void conv_cuda_pointwise_matmul_input_grad(const ConvArgs& args) {
  dispatch_conv_dtype(args.dtype, "conv cuda_pointwise_matmul",
                      [&](auto tag) { input_grad<typename decltype(tag)::type>(args); });
}

void conv_cuda_pointwise_matmul_weight_grad(const ConvArgs& args) {
  dispatch_conv_dtype(args.dtype, "conv cuda_pointwise_matmul",
                      [&](auto tag) { weight_grad<typename decltype(tag)::type>(args); });
}

}  // namespace lattice::backend::cuda

LATTICE_ROUTE_KERNELS(ConvKernels, conv_cuda_pointwise_matmul, {
    .forward = cuda::conv_cuda_pointwise_matmul_forward,
    .input_grad = cuda::conv_cuda_pointwise_matmul_input_grad,
    .weight_grad = cuda::conv_cuda_pointwise_matmul_weight_grad,
    .bias_grad = cuda::conv_cuda_bias_grad});
