// The CUDA decoder of packed affine int4/int8 weights, shared by two routes: dequant_reference.cu
// defines it; decode.cpp's dequantize route (family dequantize) calls it and dequant_gemm.cu
// registers it as the cuda_dequant_gemm route's `dequantize`. Plain C++ declarations. Every array
// on args.device (a CUDA device), contiguous row-major; work is enqueued on the current stream of
// that device and the function returns without waiting for it.
#pragma once

#include "backend/args.h"

namespace lattice::backend::cuda {

// The whole weight decoded to (K, C_in, C_out) of args.dtype on the device.
void quantized_cuda_dequantize(const DequantizeArgs& args);

}  // namespace lattice::backend::cuda
