// Decoding packed affine codes on the device (SEMANTICS.md "Packed affine quantization"), shared
// by the CUDA kernels of src/backend/cuda/quantized/. Private to that folder.
//
// One element is computed exactly as dequantize_weight() and the CPU decoder
// (src/backend/cpu/quantized/decode.h) compute it: f32 multiply then f32 add, each rounded
// separately (__fmul_rn / __fadd_rn: never contracted to an FMA), rounded to the scale dtype S,
// then to the activation dtype T (for f16 / bf16 T), with the conversions of
// common/float16.cuh (bit-for-bit those of the CPU). So every CUDA route multiplies by weights
// bit-identical to the ones dequant_reference hands the float route.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "backend/args.h"
#include "backend/cuda/common/float16.cuh"
#include "lattice/core/dtype.h"
#include "lattice/core/error.h"

namespace lattice::backend::cuda::qdetail {

// QuantizedWeightArgs as a kernel parameter, with the derived storage strides.
struct PackedWeight {
  const std::uint32_t* packed = nullptr;
  const void* scales = nullptr;
  const void* biases = nullptr;
  int bits = 4;
  int group_size = 64;
  bool by_output = false;
  std::int64_t c_in = 0;
  std::int64_t c_out = 0;
  std::int64_t words = 0;   // packed words per (k, C_out) column or per output row: C_in_st*bits/32
  std::int64_t groups = 0;  // C_in_st / group_size
};

inline PackedWeight packed_weight(const QuantizedWeightArgs& a) {
  PackedWeight w;
  w.packed = a.packed;
  w.scales = a.scales;
  w.biases = a.biases;
  w.bits = a.bits;
  w.group_size = a.group_size;
  w.by_output = a.by_output;
  w.c_in = a.c_in;
  w.c_out = a.c_out;
  w.words = a.c_in_storage / (32 / a.bits);
  w.groups = a.c_in_storage / a.group_size;
  return w;
}

// scale*code + bias in f32 without contraction, rounded to S, then to T when T is f16 / bf16.
template <class T, class S>
__device__ __forceinline__ float weight_value(std::uint32_t code, S scale, S bias) {
  float v = __fadd_rn(__fmul_rn(static_cast<float>(code), dev_load(scale)), dev_load(bias));
  if constexpr (!std::is_same_v<S, float>) v = dev_load(dev_store<S>(v));
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) v = dev_load(dev_store<T>(v));
  return v;
}

// Element (ci, co) of W[k] (logical ci < C_in, co < C_out). Storage (QuantizedWeightArgs):
//   kernel-major: packed (K, words, C_out), scales / biases (K, groups, C_out)
//   by_output:    packed (C_out, words),    scales / biases (C_out, groups)
template <class T, class S>
__device__ __forceinline__ float decode(const PackedWeight& w, std::int64_t k, std::int64_t ci, std::int64_t co) {
  // Channel arithmetic in 32 bits (C_in_st is far below 2^31); offsets in 64 bits.
  const int c = static_cast<int>(ci);
  const int per_word = 32 / w.bits;
  const std::uint32_t mask = (1u << w.bits) - 1u;
  const int shift = (c % per_word) * w.bits;
  const std::int64_t word = c / per_word;
  const std::int64_t g = c / w.group_size;
  std::int64_t word_at, scale_at;
  if (w.by_output) {
    word_at = co * w.words + word;
    scale_at = co * w.groups + g;
  } else {
    word_at = (k * w.words + word) * w.c_out + co;
    scale_at = (k * w.groups + g) * w.c_out + co;
  }
  const std::uint32_t code = (w.packed[word_at] >> shift) & mask;
  return weight_value<T, S>(code, static_cast<const S*>(w.scales)[scale_at], static_cast<const S*>(w.biases)[scale_at]);
}

// Calls f(TypeTag<S>{}) with the storage type of the scale dtype (f16, bf16, f32).
template <class F>
void dispatch_scale(Dtype dtype, const char* op, F&& f) {
  switch (dtype) {
    case Dtype::f16: f(TypeTag<Half>{}); return;
    case Dtype::bf16: f(TypeTag<BFloat16>{}); return;
    case Dtype::f32: f(TypeTag<float>{}); return;
    default:
      throw UnsupportedError(std::string("[") + op + "] scales: expected float16, bfloat16 or float32, got " +
                             std::string(to_string(dtype)));
  }
}

}  // namespace lattice::backend::cuda::qdetail
