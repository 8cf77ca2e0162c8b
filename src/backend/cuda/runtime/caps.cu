#include <cuda_runtime.h>

#include "backend/cuda/runtime/caps.h"

namespace lattice::backend::cuda {

CudaCaps query_cuda_caps() {
  CudaCaps caps;
  caps.built = true;
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    caps.device_count = 0;
    caps.status = std::string("no CUDA device: ") +
                  (err != cudaSuccess ? cudaGetErrorString(err) : "no device visible");
    cudaGetLastError();  // clear the sticky error state of this query
    return caps;
  }
  int device = 0;
  cudaGetDevice(&device);
  cudaDeviceProp prop{};
  err = cudaGetDeviceProperties(&prop, device);
  if (err != cudaSuccess) {
    caps.status = std::string("device query failed: ") + cudaGetErrorString(err);
    cudaGetLastError();
    return caps;
  }
  caps.device_count = count;
  caps.sm = prop.major * 10 + prop.minor;
  caps.tier = tier_for_sm(caps.sm);
  caps.shared_memory_per_block = static_cast<std::int64_t>(prop.sharedMemPerBlockOptin);
  caps.sm_count = prop.multiProcessorCount;
  caps.name = prop.name;
  caps.status = "ok";
  return caps;
}

}  // namespace lattice::backend::cuda
