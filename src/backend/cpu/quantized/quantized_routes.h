// The CPU decoder of packed affine int4/int8 weights (family "quantized"), shared by two routes:
// dequant_reference.cpp defines it (route dequant_reference) and decode.cpp's dequantize route
// (family dequantize) calls it. Args in backend/args.h (QuantizedWeightArgs, DequantizeArgs).
#pragma once

#include "backend/args.h"

namespace lattice::backend::cpu {

// The whole weight to (K, C_in, C_out) of args.dtype.
void quantized_dequantize_reference(const DequantizeArgs& args);

}  // namespace lattice::backend::cpu
