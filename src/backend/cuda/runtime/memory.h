// The CUDA allocator behind lattice::Array on cuda devices: stream-ordered allocation
// (cudaMallocAsync / cudaFreeAsync on the current stream of the device) from the device's
// default memory pool, kept cached (release threshold = unlimited) so repeated calls do not
// return memory to the driver.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "backend/args.h"
#include "lattice/core/array.h"

namespace lattice::backend::cuda {

// Registers the allocator with lattice::Array (idempotent; called by the kernel table).
void register_cuda_allocator();

// Copies `nbytes` device -> host on the current stream of `device` and waits for them.
void copy_to_host(void* dst, const void* src, std::size_t nbytes, Device device);

// Queues a copy of one device int64 (`value`, written by work already queued on the current
// stream of `device`) into pinned host memory, followed by an event, and returns the pending
// count: get() takes the value, waiting for the event only when it has not passed yet (then it
// counts as a host sync). No host wait here. Null while the stream is being captured into a CUDA
// graph (the caller then counts on first use, as without it).
std::shared_ptr<PendingCount> copy_count_async(const std::int64_t* value, Device device);

}  // namespace lattice::backend::cuda
