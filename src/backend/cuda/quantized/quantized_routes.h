// CUDA kernels of packed affine int4/int8 weights (family "quantized"), called through the kernel
// table. Args in backend/args.h (QuantizedWeightArgs, DequantizeArgs, QuantizedConvArgs); every
// array on args.device (a CUDA device), contiguous row-major; work is enqueued on the current
// stream of that device and the functions return without waiting for it.
#pragma once

#include "backend/args.h"

namespace lattice::backend::cuda {

// dequant_gemm.cu (route cuda_dequant_gemm): y = bias + sum over edges of x[i] @ W[k], the packed
// weight decoded tile by tile into shared memory inside the GEMM kernel.
void quantized_cuda_dequant_gemm_forward(const QuantizedConvArgs& args);

// dequant_reference.cu (route dequant_reference on CUDA data): the whole weight decoded to
// (K, C_in, C_out) of args.dtype on the device; the semantic layer then runs the float route.
void quantized_cuda_dequantize(const DequantizeArgs& args);

}  // namespace lattice::backend::cuda
