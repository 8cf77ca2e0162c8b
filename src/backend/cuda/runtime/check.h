// Every CUDA runtime call is checked: failures raise lattice::Error naming file, line and call.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "lattice/core/error.h"

namespace lattice::backend::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  throw Error(std::string("CUDA error ") + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) +
              ") in " + call + " at " + file + ":" + std::to_string(line));
}

}  // namespace lattice::backend::cuda

#define LATTICE_CUDA_CHECK(call)                                                     \
  do {                                                                               \
    cudaError_t lattice_err_ = (call);                                               \
    if (lattice_err_ != cudaSuccess)                                                 \
      ::lattice::backend::cuda::throw_cuda_error(lattice_err_, #call, __FILE__, __LINE__); \
  } while (0)
