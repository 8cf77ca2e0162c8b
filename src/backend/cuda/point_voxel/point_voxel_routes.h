// Device index builders of the point family, shared across files: defined next to the kernels
// they launch (point_voxel.cu, quantize.cu) and called by the point_index route cuda (index.cpp).
// Plain C++ declarations (index.cpp is compiled by the host compiler). The routes' own entry
// points are registered in their files (LATTICE_ROUTE_KERNELS) and declared nowhere else.
#pragma once

#include "backend/args.h"

namespace lattice::backend::cuda {

// point_voxel.cu: the CSR of points per voxel (PointGrouping) from the inverse map.
PointGroupResult group_points_by_voxel(const PointGroupArgs& args);
// quantize.cu: checked, narrowed batch ids of points.
BatchIdsResult batch_ids(const BatchIdsArgs& args);

}  // namespace lattice::backend::cuda
