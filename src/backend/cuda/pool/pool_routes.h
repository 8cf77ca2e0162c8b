// The device builders of pooling edge lists, shared across files: defined in csr_reduce.cu and
// called by the pool_edges route cuda (edges.cpp). Plain C++ declarations (edges.cpp is compiled
// by the host compiler). The routes' own entry points are registered in their files
// (LATTICE_ROUTE_KERNELS) and declared nowhere else.
#pragma once

#include "backend/args.h"

namespace lattice::backend::cuda {

// Edge lists of global pooling and trilinear upsampling for coordinates on the device.
PoolEdgeList pool_batch_edges(const BatchEdgesArgs& args);
PoolEdgeList pool_trilinear_edges(const TrilinearEdgesArgs& args);

}  // namespace lattice::backend::cuda
