#include "backend/cuda/common/coord_table.cuh"
#include "backend/cuda/common/compact.cuh"

#include <cub/device/device_scan.cuh>

#include "backend/cuda/runtime/memory.h"
#include "backend/cuda/runtime/stream.h"
#include "lattice/core/error.h"

namespace lattice::backend::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void insert_rows(CoordTableView t, std::int64_t n) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  for (std::int64_t r = i; r < n; r += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    table_insert_min(t, static_cast<std::int32_t>(r));
}

__global__ void flag_first(CoordTableView t, std::int64_t n, std::int32_t* flags) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  for (std::int64_t r = i; r < n; r += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    flags[r] = table_find(t, t.rows[r]) == r ? 1 : 0;
}

__global__ void scatter_unique(CoordTableView t, std::int64_t n, const std::int32_t* flags,
                               const std::int32_t* pos, Coord4* unique, std::int32_t* inverse) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  for (std::int64_t r = i; r < n; r += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    if (flags[r]) unique[pos[r]] = t.rows[r];
    if (inverse) inverse[r] = pos[table_find(t, t.rows[r])];
  }
}

// Smallest duplicate row (a row whose key's smallest row is another row).
__global__ void min_duplicate(CoordTableView t, std::int64_t n, unsigned long long* best) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  for (std::int64_t r = i; r < n; r += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    if (table_find(t, t.rows[r]) != r) atomicMin(best, static_cast<unsigned long long>(r));
}

__global__ void first_of(CoordTableView t, std::int64_t row, std::int64_t* out) {
  *out = table_find(t, t.rows[row]);
}

unsigned grid_for(std::int64_t n) {
  const unsigned b = blocks_for(n, kThreads);
  return b > 65535u * 16u ? 65535u * 16u : b;  // grid-stride loops cover the rest
}

}  // namespace

CoordTable build_coord_table(const Coord4* rows, std::int64_t n, Device device) {
  if (n >= (std::int64_t{1} << 30))
    throw ValueError("[coordinates] rows: expected fewer than 2^30 rows for a GPU coordinate table, got " +
                     std::to_string(n));
  DeviceGuard guard(device.index);
  std::uint64_t capacity = 64;
  while (capacity < static_cast<std::uint64_t>(2 * n)) capacity <<= 1;
  CoordTable table;
  table.rows = rows;
  table.n = n;
  table.mask = capacity - 1;
  table.slots = Array::empty({static_cast<std::int64_t>(capacity)}, Dtype::i32, device);
  cudaStream_t s = stream_of(device);
  LATTICE_CUDA_CHECK(cudaMemsetAsync(table.slots.raw_data(), 0xff, capacity * sizeof(std::int32_t), s));
  if (n > 0) {
    insert_rows<<<grid_for(n), kThreads, 0, s>>>(table.view(), n);
    LATTICE_CUDA_CHECK_LAUNCH();
  }
  return table;
}

UniqueRows unique_first_occurrence(const Coord4* candidates, std::int64_t n, Device device, bool want_inverse) {
  DeviceGuard guard(device.index);
  UniqueRows out;
  if (n == 0) {
    out.unique = Array::empty({0, 4}, Dtype::i32, device);
    if (want_inverse) out.inverse = Array::empty({0}, Dtype::i32, device);
    return out;
  }
  cudaStream_t s = stream_of(device);
  CoordTable table = build_coord_table(candidates, n, device);
  Array flags = Array::empty({n}, Dtype::i32, device);
  Array pos = Array::empty({n}, Dtype::i32, device);
  flag_first<<<grid_for(n), kThreads, 0, s>>>(table.view(), n, flags.data<std::int32_t>());
  LATTICE_CUDA_CHECK_LAUNCH();
  std::size_t temp_bytes = 0;
  LATTICE_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, temp_bytes, flags.data<std::int32_t>(),
                                                   pos.data<std::int32_t>(), n, s));
  Array temp = Array::empty({static_cast<std::int64_t>(temp_bytes)}, Dtype::u8, device);
  LATTICE_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp.raw_data(), temp_bytes, flags.data<std::int32_t>(),
                                                   pos.data<std::int32_t>(), n, s));
  const std::int64_t m = read_scan_total<std::int32_t>(pos.data<std::int32_t>(), flags.data<std::int32_t>(), n, device, s);
  out.unique = Array::empty({m, 4}, Dtype::i32, device);
  if (want_inverse) out.inverse = Array::empty({n}, Dtype::i32, device);
  scatter_unique<<<grid_for(n), kThreads, 0, s>>>(
      table.view(), n, flags.data<std::int32_t>(), pos.data<std::int32_t>(),
      reinterpret_cast<Coord4*>(out.unique.data<std::int32_t>()),
      want_inverse ? out.inverse.data<std::int32_t>() : nullptr);
  LATTICE_CUDA_CHECK_LAUNCH();
  return out;
}

DuplicatePair find_duplicate(const CoordTable& table, Device device) {
  DuplicatePair pair;
  if (table.n == 0) return pair;
  DeviceGuard guard(device.index);
  cudaStream_t s = stream_of(device);
  Array best = Array::empty({1}, Dtype::i64, device);
  const unsigned long long none = ~0ULL;
  LATTICE_CUDA_CHECK(cudaMemsetAsync(best.raw_data(), 0xff, sizeof none, s));
  min_duplicate<<<grid_for(table.n), kThreads, 0, s>>>(table.view(), table.n,
                                                       reinterpret_cast<unsigned long long*>(best.raw_data()));
  LATTICE_CUDA_CHECK_LAUNCH();
  unsigned long long row = none;
  copy_to_host(&row, best.raw_data(), sizeof row, device);
  if (row == none) return pair;
  pair.row = static_cast<std::int64_t>(row);
  // The first occurrence is the smallest row of that key, which the table keeps.
  first_of<<<1, 1, 0, s>>>(table.view(), static_cast<std::int64_t>(row), best.data<std::int64_t>());
  LATTICE_CUDA_CHECK_LAUNCH();
  std::int64_t first = -1;
  copy_to_host(&first, best.raw_data(), sizeof first, device);
  pair.first = first;
  return pair;
}

}  // namespace lattice::backend::cuda
