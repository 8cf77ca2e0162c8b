// CUDA sparse-algebra route (cuda_hashed), called through the kernel table. Same contract as the
// CPU routes (AlignArgs, LookupArgs, CombineArgs in backend/args.h), except that every pointer
// refers to memory on args.device (a cuda device) and results are allocated there. The route
// builds its own device coordinate tables (backend/cuda/common/coord_table.cuh): the host
// CoordFinder fields are ignored. Work runs on the current stream of the device.
#pragma once

#include "backend/args.h"

namespace lattice::backend::cuda {

// hashed.cu
AlignResult algebra_cuda_hashed_align(const AlignArgs& args);
void algebra_cuda_hashed_lookup(const LookupArgs& args);
void algebra_cuda_hashed_forward(const CombineArgs& args);
void algebra_cuda_hashed_backward(const CombineArgs& args);

}  // namespace lattice::backend::cuda
