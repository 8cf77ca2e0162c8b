// The caller's stream and device for CUDA work (lattice/core/stream.h holds the handle).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/runtime/check.h"
#include "lattice/core/device.h"
#include "lattice/core/stream.h"

namespace lattice::backend::cuda {

// The current stream of `device` (set by the caller; 0 = legacy default stream).
inline cudaStream_t stream_of(Device device) {
  return reinterpret_cast<cudaStream_t>(current_stream(device));
}

// Makes `index` the current CUDA device for the scope, then restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index) {
    LATTICE_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != index) LATTICE_CUDA_CHECK(cudaSetDevice(index));
    restore_ = previous_ != index;
  }
  ~DeviceGuard() {
    if (restore_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool restore_ = false;
};

// Blocks of `threads` covering n items (at least one block; grid x capped at 2^31 - 1).
inline unsigned blocks_for(std::int64_t n, int threads) {
  const std::int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 2147483647 ? 2147483647 : b));
}

// Checks the launch that was just made (configuration errors surface here; faults surface at
// the next synchronising call).
#define LATTICE_CUDA_CHECK_LAUNCH() LATTICE_CUDA_CHECK(cudaGetLastError())

}  // namespace lattice::backend::cuda
