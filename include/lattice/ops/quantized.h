// Packed affine int4/int8 weights at inference (SEMANTICS.md "Packed affine quantization"):
// linear and every convolution kind with a QuantizedWeight. Contract: the result equals the float
// op on dequantize(Q) (converted to the activation dtype) within f32 accumulation tolerance.
// Forward only: packed weights are inference-only.
//
// Routes (family "quantized", explain()): fused_dequant_gemm (CPU, decodes tiles of W inside the
// gather / GEMM / scatter loop) and dequant_reference (dequantizes the whole weight, then runs the
// float conv route chosen by the conv table).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lattice/core/array.h"
#include "lattice/ops/conv.h"
#include "lattice/route/route.h"

namespace lattice::ops {

enum class QuantizedLayout { linear, kernel_major, dense_5d };
std::string_view to_string(QuantizedLayout layout);

// A packed weight as lattice.QuantizedWeight holds it (python/lattice/quantize.py).
struct QuantizedWeight {
  Array packed;   // int32 or uint32 words: linear (C_out, W); spatial (K, W, C_out); W = C_in_st*bits/32
  Array scales;   // f16 / bf16 / f32: linear (C_out, C_in_st/G); spatial (K, C_in_st/G, C_out)
  Array biases;   // same dtype and shape as scales
  int bits = 4;
  int group_size = 64;
  QuantizedLayout layout = QuantizedLayout::kernel_major;
  std::vector<std::int64_t> shape;  // logical: (C_out, C_in), (K, C_in, C_out) or (C_out, Kx, Ky, Kz, C_in)
};

// y (n_out, C_out) of a planned convolution with a packed weight. `policy` picks a "quantized"
// route (LATTICE_FORCE_ROUTE "quantized:<route>" when it forces none); dequant_reference then runs
// the float route of plan.options.policy. ValueError / TypeError "[op] weight: ..." on a weight
// that does not fit the plan and the features.
Array quantized_conv_forward(const ConvPlan& plan, const Array& feats, const QuantizedWeight& weight,
                             const Array* bias, const RoutePolicy& policy = {});
Explanation explain_quantized_conv(const ConvPlan& plan, const Array& feats, const QuantizedWeight& weight,
                                   const RoutePolicy& policy = {});

// y (N, C_out) = feats (N, C_in) @ W^T + bias for a "linear" packed weight (C_out, C_in).
Array quantized_linear(const Array& feats, const QuantizedWeight& weight, const Array* bias,
                       const RoutePolicy& policy = {});
Explanation explain_quantized_linear(const Array& feats, const QuantizedWeight& weight,
                                     const RoutePolicy& policy = {});

// The whole weight as (K, C_in, C_out) of `dtype` (linear: (1, C_in, C_out) = W^T), computed by
// the dequant_reference kernel: what dequant_reference multiplies by.
Array dequantize_kernel_major(std::string_view op, const QuantizedWeight& weight, Dtype dtype);

}  // namespace lattice::ops
