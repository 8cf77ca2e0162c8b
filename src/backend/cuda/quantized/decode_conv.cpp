// Constraints: CUDA device (any tier, classic or above); float32, float16 or bfloat16
// activations; any relation kind (and linear), any kernel volume, edge count and channel counts;
// bits 4 / 8, group 32 / 64 / 128, scales f16 / bf16 / f32. Forward only. Deterministic: the
// decoded weight is dequantize_weight()'s, bit for bit, and the float route that runs on it is
// deterministic.
//
// The CUDA default for packed int4 / int8 weights (issue 19 item 5, "packed weights on tensor
// cores"): the whole weight is decoded on the device to a transient (K, C_in, C_out) array of the
// activation dtype (quantized_cuda_dequantize, dequant_reference.cu's kernel: decode.cuh's rule),
// and the semantic layer (src/ops/quantized.cpp) runs the float conv route the conv table
// chooses on it -- implicit_gemm_sm80's tensor-core tiles for f16 / bf16 on sm_80+, the same
// kernels an f16 model runs. The decode is one elementwise pass over K * C_in * C_out weights
// (at most a few MB for the layers of a 3-D network, read by the conv from L2), against the
// conv's pass over N * K gathered rows; the transient array returns to the pool after the call,
// so the packed weight stays the only copy at rest.
//
// Why not decode inside the GEMM tiles (cuda_dequant_gemm's design): that kernel is SIMT; a
// tensor-core kernel decoding its W tiles would need its own copy of every tile shape and the
// tuning of implicit_gemm_sm80, for a saving of one pass over a weight that is small next to the
// features. The route keeps one tensor-core pipeline for float and packed weights.
//
// Shapes: as dequant_reference (args.h DequantizeArgs: out (K, C_in, C_out) of `dtype`).
#include "backend/cuda/quantized/quantized_routes.h"
#include "backend/kernels.h"

LATTICE_ROUTE_KERNELS(QuantizedKernels, quantized_cuda_decode_conv,
                      {.dequantize = cuda::quantized_cuda_dequantize});
