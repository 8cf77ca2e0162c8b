// Support shared by the CUDA convolution routes (src/backend/cuda/conv): device element types
// for the storage dtypes, the cuBLAS handle of the calling thread, and small deterministic
// kernels (accumulator init / rounding, gather, scatter-add, relation maps, column sums).
// Every launch goes to the current stream of the given device.
//
// Contract of every CUDA conv route (ConvArgs in backend/args.h; each route's file defines its
// entry points and registers them with LATTICE_ROUTE_KERNELS): every array on args.device,
// contiguous row-major, features and weight of one dtype (f16, bf16, f32), weight in the
// canonical (K, C_in, C_out) layout; work is enqueued on the current stream of args.device and
// the functions return without waiting for it. Each pass fully overwrites its output (y, dx, dw,
// dbias). Products are accumulated in f32 (tf32 tensor cores for f32 only with args.allow_tf32)
// and every output element is rounded to the storage dtype once, at the end. Deterministic: no
// float atomics; repeated runs on one device give bitwise-identical results.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "backend/args.h"
#include "lattice/core/array.h"
#include "lattice/core/device.h"
#include "lattice/core/error.h"

namespace lattice::backend::cuda {

// Storage dtype -> device element type.
template <class T> struct DeviceElem;
template <> struct DeviceElem<Half> { using type = __half; };
template <> struct DeviceElem<BFloat16> { using type = __nv_bfloat16; };
template <> struct DeviceElem<float> { using type = float; };

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

[[noreturn]] void throw_unsupported_dtype(const char* op, Dtype dtype);

// Calls f(TypeTag<E>{}) with E = float, __half or __nv_bfloat16 for f32 / f16 / bf16; other
// dtypes raise UnsupportedError naming `op`.
template <class F>
void dispatch_conv_dtype(Dtype dtype, const char* op, F&& f) {
  switch (dtype) {
    case Dtype::f32: f(TypeTag<float>{}); return;
    case Dtype::f16: f(TypeTag<__half>{}); return;
    case Dtype::bf16: f(TypeTag<__nv_bfloat16>{}); return;
    default: throw_unsupported_dtype(op, dtype);
  }
}

// The cuBLAS handle of the calling host thread for `device` (created on first use, kept for
// the thread's lifetime), bound to the device's current stream, with a workspace set so the
// results do not depend on cuBLAS's per-stream default workspaces. The workspace Array must
// outlive the cuBLAS calls enqueued with this binding (stream-ordered free after them is fine).
struct CublasBinding {
  cublasHandle_t handle = nullptr;
  Array workspace;
};
CublasBinding bind_cublas(Device device);

// Checks a cuBLAS status (file, line, call).
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line);
#define LATTICE_CUBLAS_CHECK(call)                                                         \
  do {                                                                                     \
    cublasStatus_t lattice_st_ = (call);                                                   \
    if (lattice_st_ != CUBLAS_STATUS_SUCCESS)                                              \
      ::lattice::backend::cuda::throw_cublas_error(lattice_st_, #call, __FILE__, __LINE__); \
  } while (0)

// The cuBLAS data type of an element type (f32, f16, bf16).
template <class E> constexpr cudaDataType_t cuda_type();
template <> constexpr cudaDataType_t cuda_type<float>() { return CUDA_R_32F; }
template <> constexpr cudaDataType_t cuda_type<__half>() { return CUDA_R_16F; }
template <> constexpr cudaDataType_t cuda_type<__nv_bfloat16>() { return CUDA_R_16BF; }

// Column-major C (m, n) = op(A) (m, k) @ op(B) (k, n) + beta * C on the binding's stream:
// cublasGemmEx with inputs of type E, C of type C_t (E, or f32 for an accumulator), f32 compute
// (CUBLAS_COMPUTE_32F_FAST_TF32 when `tf32`, for f32 inputs the caller rounded to tf32 already).
// `what` names the route in the error for a dimension beyond int range.
template <class E, class C_t>
void cublas_gemm(const CublasBinding& cb, bool tf32, cublasOperation_t ta, cublasOperation_t tb, std::int64_t m,
                 std::int64_t n, std::int64_t k, const E* a, std::int64_t lda, const E* b, std::int64_t ldb,
                 float beta, C_t* c, std::int64_t ldc, const char* what) {
  for (const std::int64_t d : {m, n, k, lda, ldb, ldc})
    LATTICE_ASSERT(d >= 0 && d <= std::int64_t{INT_MAX}, std::string(what) + ": GEMM dimension exceeds int range");
  const float one = 1.0f;
  LATTICE_CUBLAS_CHECK(cublasSetMathMode(cb.handle, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  LATTICE_CUBLAS_CHECK(cublasGemmEx(cb.handle, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                                    &one, a, cuda_type<E>(), static_cast<int>(lda), b, cuda_type<E>(),
                                    static_cast<int>(ldb), &beta, c, cuda_type<C_t>(), static_cast<int>(ldc), compute,
                                    CUBLAS_GEMM_DEFAULT));
}

// acc (rows, c) f32 = bias broadcast (bias of element type E, or zeros when null).
template <class E>
void fill_accumulator(float* acc, std::int64_t rows, std::int64_t c, const E* bias, cudaStream_t s);
// out (n) E = round(acc (n) f32), once per element.
template <class E>
void round_to(const float* acc, E* out, std::int64_t n, cudaStream_t s);
// dst (m, c) = src[rows[j]] for j < m (rows int32); with `tf32` (f32 only) each value is rounded
// to the nearest tf32 value (10 mantissa bits, ties to even) on the way.
template <class E>
void gather_rows(const E* src, std::int64_t c, const std::int32_t* rows, std::int64_t m, E* dst, cudaStream_t s,
                 bool tf32 = false);
// dst (n) = src (n) rounded to the nearest tf32 value (ties to even); inf / NaN unchanged.
void round_to_tf32(const float* src, float* dst, std::int64_t n, cudaStream_t s);

// Whether a conv call's f32 GEMMs run on tf32 tensor cores (f32 storage and allow_tf32).
template <class E>
bool uses_tf32(const ConvArgs& a) {
  return std::is_same_v<E, float> && a.allow_tf32;
}

// A GEMM operand of n values on a.device: `src` itself, or (uses_tf32) a copy rounded to the
// nearest tf32 values, valid while `keep` lives; the cuBLAS routes round both operands so the
// result does not depend on how the tensor cores convert f32.
template <class E>
const E* tf32_operand(const ConvArgs& a, const void* src, std::int64_t n, cudaStream_t s, Array& keep) {
  if (!uses_tf32<E>(a) || n == 0) return static_cast<const E*>(src);
  keep = Array::empty({n}, Dtype::f32, a.device);
  round_to_tf32(static_cast<const float*>(src), keep.data<float>(), n, s);
  return reinterpret_cast<const E*>(keep.data<float>());
}
// acc[rows[j]] += part[j] for j < m (f32, (.., c)); rows distinct, so no two threads share an element.
void scatter_add_rows(const float* part, std::int64_t c, const std::int32_t* rows, std::int64_t m, float* acc,
                      cudaStream_t s);
// map (n_rows, K) int32 = -1, then map[key[e] * K + k[e]] = value[e] for every edge ((key, k) unique).
Array build_edge_map(const std::int32_t* key, const std::int32_t* value, const std::int32_t* k,
                     std::int64_t n_edges, std::int64_t n_rows, std::int64_t kernel_volume, Device device);
// db (c) = column sums of dy (n, c), f32 accumulation in a fixed order, rounded once.
template <class E>
void column_sums(const E* dy, std::int64_t n, std::int64_t c, E* db, Device device);

// Copies the (K + 1) int64 per-offset pointer to the host (one synchronisation).
std::vector<std::int64_t> offsets_to_host(const std::int64_t* k_ptr, std::int64_t kernel_volume, Device device);

// Bias gradient of both CUDA conv routes: args.dbias (C_out) = column sums of args.dy.
void conv_cuda_bias_grad(const ConvArgs& args);

}  // namespace lattice::backend::cuda
