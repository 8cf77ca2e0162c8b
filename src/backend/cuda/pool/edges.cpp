// Constraints: CUDA (data on a cuda device, the CUDA backend built and a device present); int32
// coordinate rows (N, 4) below 2^31 rows; global pooling: batch ids >= 0 (the smallest row with
// a negative one is reported) unless the batch count is given; trilinear_upsample3d: ratios >= 1,
// the coarse set's device table when cached. Any N, including none. Deterministic: the edge
// lists of the CPU reference route, bit for bit (stable radix sort by batch id; the trilinear
// rule in float64 without FMA).
//
// The route's entry points; the device kernels they launch are in csr_reduce.cu
// (pool_batch_edges, pool_trilinear_edges).
#include "backend/cuda/pool/pool_routes.h"
#include "backend/kernels.h"

namespace lattice::backend::cuda {

PoolEdgeList pool_edges_cuda_batch(const BatchEdgesArgs& args) { return pool_batch_edges(args); }

PoolEdgeList pool_edges_cuda_trilinear(const TrilinearEdgesArgs& args) { return pool_trilinear_edges(args); }

}  // namespace lattice::backend::cuda

LATTICE_ROUTE_KERNELS(PoolEdgeKernels, pool_edges_cuda, {
    .batch_edges = cuda::pool_edges_cuda_batch,
    .trilinear_edges = cuda::pool_edges_cuda_trilinear});
