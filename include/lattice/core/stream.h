// The caller's stream per CUDA device, as an opaque handle (a cudaStream_t cast to an integer;
// 0 = the legacy default stream). The core holds no CUDA headers: the Python layer sets the
// current torch stream before each call on CUDA tensors, C++ callers set their own, and the
// CUDA backend reads it to launch kernels and to order allocations (cudaMallocAsync).
//
// Thread-local: each host thread has its own current stream per device, like torch.
#pragma once

#include <cstdint>

#include "lattice/core/device.h"

namespace lattice {

void set_current_stream(Device device, std::uintptr_t stream);
std::uintptr_t current_stream(Device device);

// Sets the stream of `device` for the lifetime of the guard, then restores the previous one.
class StreamGuard {
 public:
  StreamGuard(Device device, std::uintptr_t stream) : device_(device), previous_(current_stream(device)) {
    set_current_stream(device, stream);
  }
  ~StreamGuard() { set_current_stream(device_, previous_); }
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Device device_;
  std::uintptr_t previous_;
};

}  // namespace lattice
