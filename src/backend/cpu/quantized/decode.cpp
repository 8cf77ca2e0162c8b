// Constraints: CPU; a packed affine int4 / int8 weight (bits 4 / 8, group 32 / 64 / 128, scales
// f16 / bf16 / f32) decoded whole to (K, C_in, C_out) of any float dtype (f16, bf16, f32, f64).
// Deterministic (elementwise).
//
// The packed-weight decoder route of CPU weights (family dequantize): dequantize_weight and the
// dequant_reference conv route call it; the decoding loops are dequant_reference.cpp's.
#include "backend/cpu/quantized/quantized_routes.h"
#include "backend/kernels.h"

namespace lattice::backend::cpu {

void dequantize_reference(const DequantizeArgs& args) { quantized_dequantize_reference(args); }

}  // namespace lattice::backend::cpu

LATTICE_ROUTE_KERNELS(DequantizeKernels, dequantize_reference, {.dequantize = cpu::dequantize_reference});
