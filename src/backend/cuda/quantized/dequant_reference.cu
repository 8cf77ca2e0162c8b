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

template <class T, class S, class I>
__global__ void dequantize_kernel(PackedWeight w, I n, T* __restrict__ out) {
  // I = int when every index fits in 31 bits (every weight of a 3-D network: 64-bit division is
  // tens of instructions per element), else std::int64_t; the same elements either way.
  const I per_k = static_cast<I>(w.c_in * w.c_out), c_out = static_cast<I>(w.c_out);
  for (I j = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x); j < n;
       j += static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x)) {
    const I k = j / per_k, rem = j - k * per_k;
    const I ci = rem / c_out, co = rem - ci * c_out;
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
  // 32-bit indices when n plus one grid span fits in an int (so j never overflows)
  const std::int64_t grid_span = static_cast<std::int64_t>(blocks) * threads;
  if (n + grid_span < (std::int64_t{1} << 31))
    dequantize_kernel<T, S, int><<<blocks, threads, 0, s>>>(qdetail::packed_weight(wa), static_cast<int>(n),
                                                             static_cast<T*>(a.out));
  else
    dequantize_kernel<T, S, std::int64_t><<<blocks, threads, 0, s>>>(qdetail::packed_weight(wa), n,
                                                                      static_cast<T*>(a.out));
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
