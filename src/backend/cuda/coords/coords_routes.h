// CUDA coordinate-utility route (cuda), called through the kernel table. Same contract as the
// CPU reference route (DownsampleArgs, MortonArgs, SelectArgs, CollateSample, DenseIndexArgs,
// NonzeroArgs in backend/args.h), except that every pointer refers to memory on the args' cuda
// device and results are allocated there. Work runs on the current stream of the device.
#pragma once

#include <vector>

#include "backend/args.h"

namespace lattice::backend::cuda {

// utilities.cu
DownsampleResult coords_cuda_downsample(const DownsampleArgs& args);
void coords_cuda_morton(const MortonArgs& args);
Array coords_cuda_select(const SelectArgs& args);
CollateResult coords_cuda_collate(const std::vector<CollateSample>& samples);
void coords_cuda_dense_index(const DenseIndexArgs& args);
NonzeroResult coords_cuda_nonzero(const NonzeroArgs& args);

}  // namespace lattice::backend::cuda
