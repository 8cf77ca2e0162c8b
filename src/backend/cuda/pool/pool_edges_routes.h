// The pool_edges route cuda (edges.cpp): entry points of the device edge builders of global
// pooling and trilinear upsampling (their kernels are in csr_reduce.cu). Plain C++ declarations.
#pragma once

#include "backend/args.h"

namespace lattice::backend::cuda {

PoolEdgeList pool_edges_cuda_batch(const BatchEdgesArgs& args);
PoolEdgeList pool_edges_cuda_trilinear(const TrilinearEdgesArgs& args);

}  // namespace lattice::backend::cuda
