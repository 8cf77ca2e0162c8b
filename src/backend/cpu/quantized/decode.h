// Decoding packed affine codes (SEMANTICS.md "Packed affine quantization"), shared by the CPU
// routes of src/backend/cpu/quantized/. Private to that folder.
//
// The value of one element is computed exactly as dequantize_weight() does (f32 multiply, then
// f32 add, no fused multiply-add), rounded to the scale dtype S (the dtype of the dequantized
// weight), then rounded to the activation dtype T and widened to the accumulation type: so the
// fused route multiplies by bit-identical weights to the ones dequant_reference hands the float
// route.
#pragma once

#include <cstdint>
#include <string_view>
#include <type_traits>

#include "backend/args.h"
#include "lattice/core/dtype.h"

namespace lattice::backend::cpu::qdetail {

template <class T, class S>
inline Accum<T> weight_value(std::uint32_t code, S scale, S bias) {
  volatile float prod = static_cast<float>(code) * load(scale);  // volatile: never contracted to an FMA
  const float v = prod + load(bias);
  float vs = v;
  if constexpr (!std::is_same_v<S, float>) vs = load(store<S>(v));
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    return static_cast<Accum<T>>(vs);
  } else {
    return load(store<T>(vs));
  }
}

// Rows [ci0, ci1) of W[k] (logical input channels; ci0 a multiple of 32/bits) into dst as
// Accum<T>. Layouts (QuantizedWeightArgs::by_output):
//   kernel-major: dst (ci1 - ci0, C_out) row-major, element (ci, co) at (ci - ci0) * C_out + co;
//   by_output:    dst (C_out, ci1 - ci0) row-major, element (ci, co) at co * (ci1 - ci0) + ci - ci0.
template <class T, class S>
void decode_rows(const QuantizedWeightArgs& w, std::int64_t k, std::int64_t ci0, std::int64_t ci1,
                 Accum<T>* dst) {
  const auto* scales = static_cast<const S*>(w.scales);
  const auto* biases = static_cast<const S*>(w.biases);
  const std::int64_t per_word = 32 / w.bits;
  const std::int64_t words = w.c_in_storage / per_word;
  const std::int64_t groups = w.c_in_storage / w.group_size;
  const std::uint32_t mask = (std::uint32_t{1} << w.bits) - 1;
  const std::int64_t c_out = w.c_out;
  if (!w.by_output) {
    for (std::int64_t ci = ci0; ci < ci1; ++ci) {
      const std::uint32_t* prow = w.packed + (k * words + ci / per_word) * c_out;
      const S* srow = scales + (k * groups + ci / w.group_size) * c_out;
      const S* brow = biases + (k * groups + ci / w.group_size) * c_out;
      const int shift = static_cast<int>((ci % per_word) * w.bits);
      Accum<T>* d = dst + (ci - ci0) * c_out;
      for (std::int64_t co = 0; co < c_out; ++co)
        d[co] = weight_value<T, S>((prow[co] >> shift) & mask, srow[co], brow[co]);
    }
  } else {
    const std::int64_t rows = ci1 - ci0;
    for (std::int64_t co = 0; co < c_out; ++co) {
      const std::uint32_t* prow = w.packed + co * words;
      const S* srow = scales + co * groups;
      const S* brow = biases + co * groups;
      Accum<T>* d = dst + co * rows - ci0;
      for (std::int64_t ci = ci0; ci < ci1; ++ci) {
        const int shift = static_cast<int>((ci % per_word) * w.bits);
        const std::int64_t g = ci / w.group_size;
        d[ci] = weight_value<T, S>((prow[ci / per_word] >> shift) & mask, srow[g], brow[g]);
      }
    }
  }
}

// Calls f(TypeTag<S>{}) with the storage type of the scale dtype (f16, bf16, f32).
template <class F>
decltype(auto) dispatch_scale(Dtype dtype, std::string_view op, F&& f) {
  switch (dtype) {
    case Dtype::f16: return f(TypeTag<Half>{});
    case Dtype::bf16: return f(TypeTag<BFloat16>{});
    case Dtype::f32: return f(TypeTag<float>{});
    default: throw_unsupported_dtype(op, "scales", dtype, "float16, bfloat16 or float32");
  }
}

}  // namespace lattice::backend::cpu::qdetail
