// The CUDA allocator behind lattice::Array on cuda devices: stream-ordered allocation
// (cudaMallocAsync / cudaFreeAsync on the current stream of the device) from the device's
// default memory pool, kept cached (release threshold = unlimited) so repeated calls do not
// return memory to the driver.
#pragma once

#include <cstddef>

#include "lattice/core/array.h"

namespace lattice::backend::cuda {

// Registers the allocator with lattice::Array (idempotent; called by the kernel table).
void register_cuda_allocator();

// Copies `nbytes` device -> host on the current stream of `device` and waits for them.
void copy_to_host(void* dst, const void* src, std::size_t nbytes, Device device);

}  // namespace lattice::backend::cuda
