// Constraints: CUDA device (any tier, classic or above); f32, f16 or bf16 activations as a route
// (the float CUDA conv routes that run next have no f64; the decoder itself also writes f64 for
// dequantize_kernel_major); any relation kind and linear; bits 4 / 8, group 32 / 64 / 128, scales
// f16 / bf16 / f32. Deterministic (elementwise, no atomics).
//
// The device half of the dequant_reference route (the CPU half is
// src/backend/cpu/quantized/dequant_reference.cpp; the route's admit() takes both devices): the
// whole weight is decoded to out (K, C_in, C_out) of the activation dtype, one thread per
// element (grid-stride), with decode.cuh's rule (bit-identical to dequantize_weight() and to the
// CPU decoder); the semantic layer then runs the float conv route on it (src/ops/quantized.cpp).
// One full copy of W per call: the oracle of cuda_dequant_gemm on the device.
// Shapes: out (K, C_in, C_out) of `dtype`; packed / scales / biases as QuantizedWeightArgs.
#include <cstdint>

#include "backend/cuda/quantized/decode.cuh"
#include "backend/cuda/quantized/quantized_routes.h"
#include "backend/cuda/runtime/check.h"
#include "backend/cuda/runtime/stream.h"
#include "lattice/core/error.h"

namespace lattice::backend::cuda {
namespace {

using qdetail::PackedWeight;

template <class T, class S>
__global__ void dequantize_kernel(PackedWeight w, std::int64_t n, T* __restrict__ out) {
  const std::int64_t per_k = w.c_in * w.c_out;
  for (std::int64_t j = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; j < n;
       j += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t k = j / per_k, rem = j % per_k;
    const std::int64_t ci = rem / w.c_out, co = rem % w.c_out;
    const float v = qdetail::decode<T, S>(w, k, ci, co);  // already a value of T (f16 / bf16)
    out[j] = dev_store<T>(static_cast<Accum<T>>(v));
  }
}

template <class T, class S>
void dequantize(const DequantizeArgs& a) {
  LATTICE_ASSERT(a.device.is_cuda(), "quantized dequant_reference (cuda): arrays are not on a CUDA device");
  const QuantizedWeightArgs& wa = a.w;
  const std::int64_t n = wa.kernel_volume * wa.c_in * wa.c_out;
  if (n == 0) return;
  DeviceGuard guard(a.device.index);
  cudaStream_t s = stream_of(a.device);
  constexpr int threads = 256;
  const unsigned blocks = blocks_for(n, threads) > 65535u * 8u ? 65535u * 8u : blocks_for(n, threads);
  dequantize_kernel<T, S><<<blocks, threads, 0, s>>>(qdetail::packed_weight(wa), n, static_cast<T*>(a.out));
  LATTICE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void quantized_cuda_dequantize(const DequantizeArgs& args) {
  constexpr const char* op = "quantized dequant_reference";
  dispatch_float(args.dtype, op, "dtype", [&](auto t_tag) {
    using T = typename decltype(t_tag)::type;
    qdetail::dispatch_scale(args.w.scale_dtype, op, [&](auto s_tag) {
      dequantize<T, typename decltype(s_tag)::type>(args);
    });
  });
}

}  // namespace lattice::backend::cuda
