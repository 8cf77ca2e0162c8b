// CUDA device capabilities for DeviceCaps (compiled only when the CUDA backend is built).
#pragma once

#include "lattice/core/caps.h"

namespace lattice::backend::cuda {

// Queries the current device; never throws: failures are reported in CudaCaps::status.
CudaCaps query_cuda_caps();

}  // namespace lattice::backend::cuda
