// CUDA pooling route and the device builders of pooling edge lists: plain C++ declarations
// (the kernel table is compiled by the host compiler); the kernels are in csr_reduce.cu.
#pragma once

#include "backend/args.h"

namespace lattice::backend::cuda {

// csr_reduce.cu: forward per (output row, channel) over the output-major CSR; input gradient per
// (input row, channel) over an input-major copy of the edges built on the device (stable radix
// sort), so no float atomics and the summation orders of the CPU routes (cpu/pool/pool_routes.h).
void pool_csr_reduce_forward(const PoolArgs& args);
void pool_csr_reduce_input_grad(const PoolArgs& args);

// Edge lists of global pooling and trilinear upsampling for coordinates on the device.
PoolEdgeList pool_batch_edges(const BatchEdgesArgs& args);
PoolEdgeList pool_trilinear_edges(const TrilinearEdgesArgs& args);

}  // namespace lattice::backend::cuda
