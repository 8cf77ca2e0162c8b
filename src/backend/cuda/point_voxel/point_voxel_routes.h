// CUDA point <-> voxel routes (point_voxel.cu), sparse_quantize (quantize.cu) and the device
// index builders of the point family: plain C++ declarations (the kernel table is compiled by
// the host compiler).
#pragma once

#include "backend/args.h"

namespace lattice::backend::cuda {

// point_voxel.cu: one thread per output element, each reducing in the CPU routes' order
// (cpu/point_voxel/point_voxel_routes.h); no atomics on features.
void voxelize_forward(const VoxelizeArgs& args);
void voxelize_backward(const VoxelizeArgs& args);
void devoxelize_forward(const DevoxelizeArgs& args);
void devoxelize_backward(const DevoxelizeArgs& args);
PointVoxelMapResult point_voxel_map(const PointVoxelMapArgs& args);
// The CSR of points per voxel (PointGrouping) from the inverse map.
PointGroupResult group_points_by_voxel(const PointGroupArgs& args);

// quantize.cu
QuantizeResult quantize(const QuantizeArgs& args);
// Checked, narrowed batch ids of points.
BatchIdsResult batch_ids(const BatchIdsArgs& args);

}  // namespace lattice::backend::cuda
