// Constraints: CUDA device (any tier, classic or above); f16, bf16 or f32 (not f64: cuBLAS has
// no f32-accumulating f64 path here and the CPU routes cover f64); any relation kind, any kernel
// volume, any edge count, any channel counts. f32 GEMMs use tf32 only with allow_tf32.
// Deterministic: bitwise-identical results for the same inputs, device and build.
//
// Per kernel offset k (the per-offset grouping k_ptr / k_in / k_out of the relation), on the
// caller's stream and in ascending k:
//   forward     G = x[k_in[e]] (E_k, C_in); P = G @ W[k] (f32); acc[k_out[e]] += P[e]
//   input_grad  G = dy[k_out[e]] (E_k, C_out); P = G @ W[k]^T (f32); acc[k_in[e]] += P[e]
//   weight_grad dW[k] = x[k_in]^T @ dy[k_out] (f32 GEMM output, zero for offsets without edges)
// The GEMMs are cublasGemmEx with f16 / bf16 / f32 inputs, f32 output and CUBLAS_COMPUTE_32F
// (CUBLAS_COMPUTE_32F_FAST_TF32 for f32 with allow_tf32; both operands are then rounded to the
// nearest tf32 value first, in the gather and in a copy of W, so the result does not depend on
// how the tensor cores convert f32 inputs). The accumulator is f32 (the output
// itself for f32); forward starts it at the bias; each element is rounded to the storage dtype
// once at the end. The per-offset sizes come from one host copy of k_ptr (K + 1 int64).
//
// Shapes (K = kernel volume, E_k = edges of offset k): x (n_in, C_in), w (K, C_in, C_out),
//   bias (C_out) or null, y (n_out, C_out), dy (n_out, C_out), dx (n_in, C_in), dw (K, C_in, C_out).
//   Buffers: G (max E_k, C) in the storage dtype, P (max E_k, C) f32, the f32 accumulator for
//   f16 / bf16, a 32 MiB cuBLAS workspace.
// Determinism: within one offset every destination row occurs at most once (one edge per
// (o, k), and per (i, k) for the input gradient), so the scatter-add kernel has no races and
// no atomics; offsets are applied in order on one stream; cuBLAS runs with a fixed workspace,
// atomics disallowed, on one stream, which makes its GEMMs reproducible on one device.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "backend/cuda/common/conv_support.cuh"
#include "backend/cuda/runtime/check.h"
#include "backend/cuda/runtime/stream.h"
#include "backend/kernels.h"
#include "lattice/core/error.h"

namespace lattice::backend::cuda {
namespace {

constexpr const char* kRoute = "conv cuda_gather_gemm_scatter";

void check_grouping(const RelationView& rel) {
  LATTICE_ASSERT(rel.n_edges == 0 || (rel.k_ptr && rel.k_in && rel.k_out),
                 "conv cuda_gather_gemm_scatter: per-offset grouping (k_ptr, k_in, k_out) is null");
}

// The per-offset segment bounds on the host: the relation's cached copy when the caller attached
// one (no synchronisation), else read back from the device (one synchronisation).
std::vector<std::int64_t> host_offsets(const RelationView& rel, Device device) {
  if (const std::int64_t* h = rel.host_k_ptr()) return std::vector<std::int64_t>(h, h + rel.kernel_volume + 1);
  return offsets_to_host(rel.k_ptr, rel.kernel_volume, device);
}

std::int64_t max_segment(const std::vector<std::int64_t>& kp) {
  std::int64_t m = 0;
  for (std::size_t k = 0; k + 1 < kp.size(); ++k) m = std::max(m, kp[k + 1] - kp[k]);
  return m;
}

// acc (n_dst, c_dst) += sum_k scatter_{dst_k}(gather_{src_k}(src) @ op(W[k])), offsets in order.
// forward: src = x, src rows k_in, dst rows k_out, W[k] as is; input_grad: src = dy, src rows
// k_out, dst rows k_in, W[k]^T.
template <class E>
void accumulate(const ConvArgs& a, bool transpose_w, const E* src, std::int64_t c_src, const std::int32_t* src_rows,
                const std::int32_t* dst_rows, std::int64_t c_dst, float* acc, cudaStream_t s) {
  const RelationView& rel = a.rel;
  const std::vector<std::int64_t> kp = host_offsets(rel, a.device);
  const std::int64_t max_e = max_segment(kp);
  if (max_e == 0) return;
  Array g = Array::empty({max_e, c_src}, a.dtype, a.device);
  Array p = Array::empty({max_e, c_dst}, Dtype::f32, a.device);
  const CublasBinding cb = bind_cublas(a.device);
  const bool tf32 = uses_tf32<E>(a);
  Array w_tf32;
  const E* w = tf32_operand<E>(a, a.w, a.rel.kernel_volume * a.c_in * a.c_out, s, w_tf32);
  for (std::int64_t k = 0; k < rel.kernel_volume; ++k) {
    const std::int64_t m = kp[static_cast<std::size_t>(k) + 1] - kp[static_cast<std::size_t>(k)];
    if (m == 0) continue;
    const std::int64_t e0 = kp[static_cast<std::size_t>(k)];
    gather_rows<E>(src, c_src, src_rows + e0, m, g.data<E>(), s, tf32);
    const E* wk = w + k * a.c_in * a.c_out;
    if (!transpose_w) {
      // P^T (C_out, m) = W_k^T (col-major view of row-major W_k) @ G^T.
      cublas_gemm<E, float>(cb, tf32, CUBLAS_OP_N, CUBLAS_OP_N, a.c_out, m, a.c_in, wk, a.c_out, g.data<E>(), a.c_in,
                            0.0f, p.data<float>(), a.c_out, kRoute);
    } else {
      // P^T (C_in, m) = W_k (transpose of the col-major view) @ G^T.
      cublas_gemm<E, float>(cb, tf32, CUBLAS_OP_T, CUBLAS_OP_N, a.c_in, m, a.c_out, wk, a.c_out, g.data<E>(), a.c_out,
                            0.0f, p.data<float>(), a.c_in, kRoute);
    }
    scatter_add_rows(p.data<float>(), c_dst, dst_rows + e0, m, acc, s);
  }
}

template <class E>
void forward(const ConvArgs& a) {
  const RelationView& rel = a.rel;
  check_grouping(rel);
  DeviceGuard guard(a.device.index);
  cudaStream_t s = stream_of(a.device);
  const std::int64_t n = rel.n_out * a.c_out;
  if (n == 0) return;
  auto* y = static_cast<E*>(a.y);
  Array acc_buf;
  float* acc = nullptr;
  if constexpr (std::is_same_v<E, float>) {
    acc = y;
  } else {
    acc_buf = Array::empty({rel.n_out, a.c_out}, Dtype::f32, a.device);
    acc = acc_buf.data<float>();
  }
  fill_accumulator<E>(acc, rel.n_out, a.c_out, static_cast<const E*>(a.bias), s);
  if (rel.n_edges > 0 && a.c_in > 0)
    accumulate<E>(a, false, static_cast<const E*>(a.x), a.c_in, rel.k_in, rel.k_out, a.c_out, acc, s);
  if constexpr (!std::is_same_v<E, float>) round_to<E>(acc, y, n, s);
}

template <class E>
void input_grad(const ConvArgs& a) {
  const RelationView& rel = a.rel;
  check_grouping(rel);
  DeviceGuard guard(a.device.index);
  cudaStream_t s = stream_of(a.device);
  const std::int64_t n = rel.n_in * a.c_in;
  if (n == 0) return;
  auto* dx = static_cast<E*>(a.dx);
  Array acc_buf;
  float* acc = nullptr;
  if constexpr (std::is_same_v<E, float>) {
    acc = dx;
  } else {
    acc_buf = Array::empty({rel.n_in, a.c_in}, Dtype::f32, a.device);
    acc = acc_buf.data<float>();
  }
  fill_accumulator<E>(acc, rel.n_in, a.c_in, nullptr, s);
  if (rel.n_edges > 0 && a.c_out > 0)
    accumulate<E>(a, true, static_cast<const E*>(a.dy), a.c_out, rel.k_out, rel.k_in, a.c_in, acc, s);
  if constexpr (!std::is_same_v<E, float>) round_to<E>(acc, dx, n, s);
}

template <class E>
void weight_grad(const ConvArgs& a) {
  const RelationView& rel = a.rel;
  check_grouping(rel);
  DeviceGuard guard(a.device.index);
  cudaStream_t s = stream_of(a.device);
  const std::int64_t per_offset = a.c_in * a.c_out;
  const std::int64_t n = rel.kernel_volume * per_offset;
  if (n == 0) return;
  auto* dw = static_cast<E*>(a.dw);
  Array acc_buf;
  float* acc = nullptr;
  if constexpr (std::is_same_v<E, float>) {
    acc = dw;
  } else {
    acc_buf = Array::empty({rel.kernel_volume, a.c_in, a.c_out}, Dtype::f32, a.device);
    acc = acc_buf.data<float>();
  }
  LATTICE_CUDA_CHECK(cudaMemsetAsync(acc, 0, static_cast<std::size_t>(n) * sizeof(float), s));
  if (rel.n_edges > 0) {
    const std::vector<std::int64_t> kp = host_offsets(rel, a.device);
    const std::int64_t max_e = max_segment(kp);
    Array gx = Array::empty({max_e, a.c_in}, a.dtype, a.device);
    Array gdy = Array::empty({max_e, a.c_out}, a.dtype, a.device);
    const CublasBinding cb = bind_cublas(a.device);
    for (std::int64_t k = 0; k < rel.kernel_volume; ++k) {
      const std::int64_t m = kp[static_cast<std::size_t>(k) + 1] - kp[static_cast<std::size_t>(k)];
      if (m == 0) continue;
      const std::int64_t e0 = kp[static_cast<std::size_t>(k)];
      gather_rows<E>(static_cast<const E*>(a.x), a.c_in, rel.k_in + e0, m, gx.data<E>(), s, uses_tf32<E>(a));
      gather_rows<E>(static_cast<const E*>(a.dy), a.c_out, rel.k_out + e0, m, gdy.data<E>(), s, uses_tf32<E>(a));
      // dW_k^T (C_out, C_in) col-major = Gdy^T (C_out, m) @ Gx (m, C_in): row-major dW_k.
      cublas_gemm<E, float>(cb, uses_tf32<E>(a), CUBLAS_OP_N, CUBLAS_OP_T, a.c_out, a.c_in, m, gdy.data<E>(), a.c_out,
                            gx.data<E>(), a.c_in, 0.0f, acc + k * per_offset, a.c_out, kRoute);
    }
  }
  if constexpr (!std::is_same_v<E, float>) round_to<E>(acc, dw, n, s);
}

}  // namespace

void conv_cuda_gather_gemm_scatter_forward(const ConvArgs& args) {
  dispatch_conv_dtype(args.dtype, "conv cuda_gather_gemm_scatter",
                      [&](auto tag) { forward<typename decltype(tag)::type>(args); });
}

void conv_cuda_gather_gemm_scatter_input_grad(const ConvArgs& args) {
  dispatch_conv_dtype(args.dtype, "conv cuda_gather_gemm_scatter",
                      [&](auto tag) { input_grad<typename decltype(tag)::type>(args); });
}

void conv_cuda_gather_gemm_scatter_weight_grad(const ConvArgs& args) {
  dispatch_conv_dtype(args.dtype, "conv cuda_gather_gemm_scatter",
                      [&](auto tag) { weight_grad<typename decltype(tag)::type>(args); });
}

}  // namespace lattice::backend::cuda

LATTICE_ROUTE_KERNELS(ConvKernels, conv_cuda_gather_gemm_scatter, {
    .forward = cuda::conv_cuda_gather_gemm_scatter_forward,
    .input_grad = cuda::conv_cuda_gather_gemm_scatter_input_grad,
    .weight_grad = cuda::conv_cuda_gather_gemm_scatter_weight_grad,
    .bias_grad = cuda::conv_cuda_bias_grad});
