// Constraints: CUDA (data on a cuda device, the CUDA backend built and a device present); batch
// ids int32 or int64 (P), checked to lie in [0, 2^31) (the smallest row outside is reported) and
// narrowed to int32; point grouping: a point -> voxel row map (P) int64 with rows in [0, M). Any
// P and M, including none. Deterministic: the CPU reference route's results, bit for bit (a
// stable radix sort of the points by voxel row).
//
// The route's entry points; the device kernels they launch are in quantize.cu (batch_ids) and
// point_voxel.cu (group_points_by_voxel).
#include "backend/cuda/point_voxel/point_voxel_routes.h"
#include "backend/kernels.h"

namespace lattice::backend::cuda {

BatchIdsResult point_index_cuda_batch_ids(const BatchIdsArgs& args) { return batch_ids(args); }

PointGroupResult point_index_cuda_group(const PointGroupArgs& args) { return group_points_by_voxel(args); }

}  // namespace lattice::backend::cuda

LATTICE_ROUTE_KERNELS(PointIndexKernels, point_index_cuda, {
    .batch_ids = cuda::point_index_cuda_batch_ids,
    .group = cuda::point_index_cuda_group});
