// Stable grouping of items by a small non-negative integer key on the device (the CUDA form of
// the CPU's stable counting sorts): an LSD radix sort of (key, item) pairs (CUB, stable: items
// of one key keep their input order) and the CSR pointer of the sorted keys by binary search.
// Deterministic (no atomics); runs on the current stream of the device.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cub/device/device_radix_sort.cuh>
#include <type_traits>

#include "backend/cuda/common/compact.cuh"
#include "backend/cuda/runtime/check.h"
#include "backend/cuda/runtime/stream.h"
#include "lattice/core/array.h"

namespace lattice::backend::cuda::group_detail {

template <class V>
__global__ void iota_kernel(V* out, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride)
    out[i] = static_cast<V>(i);
}

// ptr[g] = first position of a key >= g in sorted[0, n), for g in [0, groups].
template <class K>
__global__ void lower_bounds_kernel(const K* sorted, std::int64_t n, std::int64_t groups,
                                    std::int64_t* ptr) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t g = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       g <= groups; g += stride) {
    std::int64_t lo = 0, hi = n;
    while (lo < hi) {
      const std::int64_t mid = lo + (hi - lo) / 2;
      if (static_cast<std::int64_t>(sorted[mid]) < g)
        lo = mid + 1;
      else
        hi = mid;
    }
    ptr[g] = lo;
  }
}

}  // namespace lattice::backend::cuda::group_detail

namespace lattice::backend::cuda {

// Bits needed to represent every key in [0, max_key].
inline int key_bits(std::int64_t max_key) {
  int bits = 1;
  while (bits < 63 && (std::int64_t{1} << bits) <= max_key) ++bits;
  return bits;
}

template <class V>
void fill_iota(V* out, std::int64_t n, Device device) {
  if (n == 0) return;
  group_detail::iota_kernel<<<route_grid(n), kRouteThreads, 0, stream_of(device)>>>(out, n);
  LATTICE_CUDA_CHECK_LAUNCH();
}

// Stable sort of n (key, value) pairs by key; keys are unsigned (uint32 or uint64) and below
// 2^end_bit.
template <class K, class V>
void stable_sort_pairs(const K* keys_in, K* keys_out, const V* vals_in, V* vals_out, std::int64_t n,
                       int end_bit, Device device) {
  static_assert(std::is_unsigned_v<K>, "radix keys are unsigned");
  if (n == 0) return;
  cudaStream_t s = stream_of(device);
  std::size_t temp_bytes = 0;
  LATTICE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_out, vals_in,
                                                     vals_out, n, 0, end_bit, s));
  Array temp = Array::empty({static_cast<std::int64_t>(temp_bytes > 0 ? temp_bytes : 1)}, Dtype::u8, device);
  LATTICE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.raw_data(), temp_bytes, keys_in, keys_out,
                                                     vals_in, vals_out, n, 0, end_bit, s));
}

// CSR pointer (groups + 1 entries) of n keys sorted ascending, every key < groups.
template <class K>
void csr_from_sorted_keys(const K* sorted, std::int64_t n, std::int64_t groups, std::int64_t* ptr,
                          Device device) {
  group_detail::lower_bounds_kernel<<<route_grid(groups + 1), kRouteThreads, 0, stream_of(device)>>>(
      sorted, n, groups, ptr);
  LATTICE_CUDA_CHECK_LAUNCH();
}

}  // namespace lattice::backend::cuda
