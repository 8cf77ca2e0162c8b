// Order-preserving compaction support for the CUDA routes: an exclusive prefix sum of 0/1 flags
// (CUB, deterministic) on the current stream of the device, returning the total. Writing kept
// item i to pos[i] then yields the kept items in increasing index order.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cub/device/device_scan.cuh>

#include "backend/cuda/runtime/check.h"
#include "backend/cuda/runtime/memory.h"
#include "backend/cuda/runtime/stream.h"
#include "lattice/core/array.h"

namespace lattice::backend::cuda {

// total[0] = pos[n - 1] + flags[n - 1]: the count of an exclusive scan, summed on the device so
// that one read-back (not two) brings it to the host.
template <class F>
__global__ void scan_total_kernel(const F* pos, const F* flags, std::int64_t n, std::int64_t* total) {
  total[0] = static_cast<std::int64_t>(pos[n - 1]) + static_cast<std::int64_t>(flags[n - 1]);
}

// The count of an exclusive scan of n > 0 flags into pos: one host synchronisation.
template <class F>
std::int64_t read_scan_total(const F* pos, const F* flags, std::int64_t n, Device device, cudaStream_t s) {
  Array total = Array::empty({1}, Dtype::i64, device);
  scan_total_kernel<F><<<1, 1, 0, s>>>(pos, flags, n, total.data<std::int64_t>());
  LATTICE_CUDA_CHECK(cudaGetLastError());
  std::int64_t h = 0;
  copy_to_host(&h, total.raw_data(), sizeof h, device);
  return h;
}

// pos[i] = flags[0] + ... + flags[i-1] for i < n; returns the sum of all n flags (one host
// synchronisation to read it; 0 without any device work when n == 0). Flag and position types
// are int32 or int64 (int64 when the sum can reach 2^31).
template <class F>
std::int64_t exclusive_count(const F* flags, F* pos, std::int64_t n, Device device) {
  if (n == 0) return 0;
  DeviceGuard guard(device.index);
  cudaStream_t s = stream_of(device);
  std::size_t temp_bytes = 0;
  LATTICE_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, temp_bytes, flags, pos, n, s));
  Array temp = Array::empty({static_cast<std::int64_t>(temp_bytes > 0 ? temp_bytes : 1)}, Dtype::u8, device);
  LATTICE_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp.raw_data(), temp_bytes, flags, pos, n, s));
  return read_scan_total<F>(pos, flags, n, device, s);
}

// Grid for grid-stride loops over n items with kRouteThreads threads per block.
constexpr int kRouteThreads = 256;
inline unsigned route_grid(std::int64_t n) {
  const unsigned b = blocks_for(n, kRouteThreads);
  return b > 65535u * 16u ? 65535u * 16u : b;
}

}  // namespace lattice::backend::cuda
