// The point_index route cuda (index.cpp): entry points of the device batch id check and point
// grouping (their kernels are in quantize.cu and point_voxel.cu). Plain C++ declarations.
#pragma once

#include "backend/args.h"

namespace lattice::backend::cuda {

BatchIdsResult point_index_cuda_batch_ids(const BatchIdsArgs& args);
PointGroupResult point_index_cuda_group(const PointGroupArgs& args);

}  // namespace lattice::backend::cuda
