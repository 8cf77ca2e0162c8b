// CPU routes of packed affine int4/int8 weights (family "quantized"), called through the kernel
// table. Args in backend/args.h (QuantizedWeightArgs, DequantizeArgs, QuantizedConvArgs).
#pragma once

#include "backend/args.h"

namespace lattice::backend::cpu {

// dequant_reference.cpp: the whole weight to (K, C_in, C_out) of the activation dtype; the
// semantic layer then runs the float conv route on it.
void quantized_dequantize_reference(const DequantizeArgs& args);

// fused_dequant_gemm.cpp: gather / GEMM / scatter with W dequantized tile by tile inside the loop.
void quantized_fused_dequant_gemm_forward(const QuantizedConvArgs& args);

}  // namespace lattice::backend::cpu
