// Constraints: CPU (this file; CUDA data: src/backend/cuda/quantized/dequant_reference.cu); any
// float activation dtype (f16, bf16, f32, f64); any relation kind and linear; bits 4 / 8, group
// 32 / 64 / 128, scales f16 / bf16 / f32. Deterministic.
//
// The reference route of packed weights: the whole weight is dequantized to (K, C_in, C_out) of
// the activation dtype (value = scale*code + bias in f32, rounded to the scale dtype, then to the
// activation dtype: decode.h), and the semantic layer runs the float conv route on it
// (src/ops/quantized.cpp). One full copy of W per call; the oracle for fused_dequant_gemm.
// Shapes: out (K, C_in, C_out) of `dtype`; packed / scales / biases as QuantizedWeightArgs.
#include <cstdint>
#include <vector>

#include "backend/cpu/quantized/decode.h"
#include "backend/cpu/quantized/quantized_routes.h"
#include "backend/kernels.h"

namespace lattice::backend::cpu {
namespace {

template <class T, class S>
void dequantize(const DequantizeArgs& a) {
  const QuantizedWeightArgs& w = a.w;
  auto* out = static_cast<T*>(a.out);
  const std::int64_t per_k = w.c_in * w.c_out;
  std::vector<Accum<T>> tile(static_cast<std::size_t>(per_k));
  for (std::int64_t k = 0; k < w.kernel_volume; ++k) {
    qdetail::decode_rows<T, S>(w, k, 0, w.c_in, tile.data());
    T* dst = out + k * per_k;
    for (std::int64_t ci = 0; ci < w.c_in; ++ci)
      for (std::int64_t co = 0; co < w.c_out; ++co) {
        // decode_rows' layouts: kernel-major (ci, co); by_output (co, ci).
        const Accum<T> v = w.by_output ? tile[static_cast<std::size_t>(co * w.c_in + ci)]
                                       : tile[static_cast<std::size_t>(ci * w.c_out + co)];
        dst[ci * w.c_out + co] = store<T>(v);
      }
  }
}

}  // namespace

void quantized_dequantize_reference(const DequantizeArgs& args) {
  dispatch_float(args.dtype, "quantized_dequant_reference", "dtype", [&](auto t_tag) {
    qdetail::dispatch_scale(args.w.scale_dtype, "quantized_dequant_reference", [&](auto s_tag) {
      dequantize<typename decltype(t_tag)::type, typename decltype(s_tag)::type>(args);
    });
  });
}

}  // namespace lattice::backend::cpu

LATTICE_ROUTE_KERNELS(QuantizedKernels, quantized_dequant_reference, {
    .dequantize = cpu::quantized_dequantize_reference});
