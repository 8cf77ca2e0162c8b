// Constraints: CUDA (data on a cuda device, the CUDA backend built and a device present); a
// packed affine int4 / int8 weight (bits 4 / 8, group 32 / 64 / 128, scales f16 / bf16 / f32)
// decoded whole to (K, C_in, C_out) of any float dtype (f16, bf16, f32, f64). Deterministic
// (elementwise, no atomics): the CPU reference route's values, bit for bit.
//
// The packed-weight decoder route of CUDA weights (family dequantize); the kernel is
// dequant_reference.cu's (quantized_cuda_dequantize).
#include "backend/cuda/quantized/quantized_routes.h"
#include "backend/kernels.h"

namespace lattice::backend::cuda {

void dequantize_cuda(const DequantizeArgs& args) { quantized_cuda_dequantize(args); }

}  // namespace lattice::backend::cuda

LATTICE_ROUTE_KERNELS(DequantizeKernels, dequantize_cuda, {.dequantize = cuda::dequantize_cuda});
