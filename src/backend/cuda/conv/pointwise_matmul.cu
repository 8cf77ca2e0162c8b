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
#include <climits>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/common/conv_support.cuh"
#include "backend/cuda/runtime/check.h"
#include "backend/cuda/runtime/stream.h"
#include "backend/kernels.h"
#include "lattice/core/error.h"

namespace lattice::backend::cuda {
namespace {

template <class E> constexpr cudaDataType_t cuda_type();
template <> constexpr cudaDataType_t cuda_type<float>() { return CUDA_R_32F; }
template <> constexpr cudaDataType_t cuda_type<__half>() { return CUDA_R_16F; }
template <> constexpr cudaDataType_t cuda_type<__nv_bfloat16>() { return CUDA_R_16BF; }

// The largest row count one GEMM takes (an int dimension, a multiple of 16 so chunks stay aligned).
constexpr std::int64_t kMaxRows = std::int64_t{1} << 30;

int as_int(std::int64_t v) {
  LATTICE_ASSERT(v >= 0 && v <= INT_MAX, "conv cuda_pointwise_matmul: GEMM dimension exceeds int range");
  return static_cast<int>(v);
}

void check_pointwise(const ConvArgs& a) {
  LATTICE_ASSERT(a.rel.kernel_volume == 1 && a.rel.identity && a.rel.n_in == a.rel.n_out,
                 "conv cuda_pointwise_matmul: requires kernel volume 1 and the identity relation");
}

// Column-major C (m, n) = op(A) (m, k) @ op(B) (k, n) + beta * C; inputs of type E, C of type
// C_t (E, or f32 for an accumulator), f32 compute.
template <class E, class C_t>
void gemm(const CublasBinding& cb, bool tf32, cublasOperation_t ta, cublasOperation_t tb, std::int64_t m,
          std::int64_t n, std::int64_t k, const E* a, std::int64_t lda, const E* b, std::int64_t ldb, float beta,
          C_t* c, std::int64_t ldc) {
  const float one = 1.0f;
  LATTICE_CUBLAS_CHECK(cublasSetMathMode(cb.handle, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  LATTICE_CUBLAS_CHECK(cublasGemmEx(cb.handle, ta, tb, as_int(m), as_int(n), as_int(k), &one, a, cuda_type<E>(),
                                    as_int(lda), b, cuda_type<E>(), as_int(ldb), &beta, c, cuda_type<C_t>(),
                                    as_int(ldc), compute, CUBLAS_GEMM_DEFAULT));
}

template <class E>
bool uses_tf32(const ConvArgs& a) {
  return std::is_same_v<E, float> && a.allow_tf32;
}

// `src` itself, or (tf32) a copy of its n values rounded to the nearest tf32 value, valid while
// `keep` lives.
template <class E>
const E* operand(const ConvArgs& a, const void* src, std::int64_t n, cudaStream_t s, Array& keep) {
  if (!uses_tf32<E>(a) || n == 0) return static_cast<const E*>(src);
  keep = Array::empty({n}, Dtype::f32, a.device);
  round_to_tf32(static_cast<const float*>(src), keep.data<float>(), n, s);
  return reinterpret_cast<const E*>(keep.data<float>());
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
  Array keep_x, keep_w;
  const E* x = operand<E>(a, a.x, n * a.c_in, s, keep_x);
  const E* w = operand<E>(a, a.w, a.c_in * a.c_out, s, keep_w);
  const CublasBinding cb = bind_cublas(a.device);
  for (std::int64_t r0 = 0; r0 < n; r0 += kMaxRows) {
    const std::int64_t m = std::min(kMaxRows, n - r0);
    // Y^T (C_out, m) col-major = W^T (the col-major view of row-major W) @ X^T.
    gemm<E, E>(cb, uses_tf32<E>(a), CUBLAS_OP_N, CUBLAS_OP_N, a.c_out, m, a.c_in, w, a.c_out, x + r0 * a.c_in,
               a.c_in, bias ? 1.0f : 0.0f, y + r0 * a.c_out, a.c_out);
  }
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
  Array keep_dy, keep_w;
  const E* dy = operand<E>(a, a.dy, n * a.c_out, s, keep_dy);
  const E* w = operand<E>(a, a.w, a.c_in * a.c_out, s, keep_w);
  const CublasBinding cb = bind_cublas(a.device);
  for (std::int64_t r0 = 0; r0 < n; r0 += kMaxRows) {
    const std::int64_t m = std::min(kMaxRows, n - r0);
    // dX^T (C_in, m) col-major = W (the transpose of the col-major view) @ dY^T.
    gemm<E, E>(cb, uses_tf32<E>(a), CUBLAS_OP_T, CUBLAS_OP_N, a.c_in, m, a.c_out, w, a.c_out, dy + r0 * a.c_out,
               a.c_out, 0.0f, dx + r0 * a.c_in, a.c_in);
  }
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
  const E* x = operand<E>(a, a.x, n * a.c_in, s, keep_x);
  const E* dy = operand<E>(a, a.dy, n * a.c_out, s, keep_dy);
  const CublasBinding cb = bind_cublas(a.device);
  // dW^T (C_out, C_in) col-major = dY^T (C_out, m) @ X (m, C_in): row-major dW.
  if (n <= kMaxRows) {
    gemm<E, E>(cb, uses_tf32<E>(a), CUBLAS_OP_N, CUBLAS_OP_T, a.c_out, a.c_in, n, dy, a.c_out, x, a.c_in, 0.0f, dw,
               a.c_out);
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
    gemm<E, float>(cb, uses_tf32<E>(a), CUBLAS_OP_N, CUBLAS_OP_T, a.c_out, a.c_in, m, dy + r0 * a.c_out, a.c_out,
                   x + r0 * a.c_in, a.c_in, r0 == 0 ? 0.0f : 1.0f, acc, a.c_out);
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
