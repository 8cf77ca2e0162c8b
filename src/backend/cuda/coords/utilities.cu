// Constraints: CUDA (data on a cuda device, the CUDA backend built and a device present); any
// int32 coordinate rows (N, 4) (downsample, crop, dense) or (N, 3|4) (Morton, sparse_collate
// samples); downsample on fewer than 2^30 rows (the device coordinate table's limit); strides
// >= 1; Morton values x, y, z within [-2^20, 2^20) (checked by the semantic layer); prune masks
// of N bytes; dense rows inside the grid and from_dense masks of B*X*Y*Z bytes (checked by the
// semantic layer); any N, including none. Deterministic: bitwise-identical results run to run,
// equal to the CPU reference route.
//
// The same results as src/backend/cpu/coords/reference.cpp, computed on the device:
// downsample: the strided rows are deduplicated by the device coordinate table in
// first-occurrence order (unique_first_occurrence), with the input -> output row map.
// Morton: the same 63-bit codes; the order by (batch, code) is two stable LSD radix sorts (CUB
// DeviceRadixSort is stable): by code, then by batch, so ties keep the input order exactly as
// std::stable_sort does.
// prune / crop / from_dense: flag, exclusive prefix sum (CUB), scatter: kept rows ascending.
// sparse_collate: one copy kernel per sample. dense: one thread per row.
// One host synchronisation per compaction (to size the output).
#include <cuda_runtime.h>

#include <cstdint>
#include <cub/device/device_radix_sort.cuh>
#include <vector>

#include "backend/common/geometry.h"
#include "backend/cuda/common/compact.cuh"
#include "backend/cuda/common/coord_table.cuh"
#include "backend/cuda/runtime/check.h"
#include "backend/cuda/runtime/memory.h"
#include "backend/cuda/runtime/stream.h"
#include "backend/kernels.h"

namespace lattice::backend::cuda {
namespace {

using geometry::Coord4;

constexpr std::int64_t kMortonOffset = std::int64_t{1} << 20;

__device__ inline std::int64_t thread_index() {
  return blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
}
__device__ inline std::int64_t thread_stride() { return static_cast<std::int64_t>(gridDim.x) * blockDim.x; }

// ---- downsample ----------------------------------------------------------------------------------

__global__ void strided_rows(const std::int32_t* coords, std::int64_t n, Int3 stride, Coord4* out) {
  for (std::int64_t i = thread_index(); i < n; i += thread_stride()) {
    const std::int32_t* c = coords + 4 * i;
    out[i] = Coord4{c[0], static_cast<std::int32_t>(geometry::floor_div(c[1], stride[0])),
                    static_cast<std::int32_t>(geometry::floor_div(c[2], stride[1])),
                    static_cast<std::int32_t>(geometry::floor_div(c[3], stride[2]))};
  }
}

__global__ void widen(const std::int32_t* in, std::int64_t n, std::int64_t* out) {
  for (std::int64_t i = thread_index(); i < n; i += thread_stride()) out[i] = in[i];
}

// ---- Morton --------------------------------------------------------------------------------------

// The 21 low bits of v spread to every third bit (bit i -> bit 3i).
__device__ inline std::uint64_t spread3(std::uint64_t v) {
  std::uint64_t r = 0;
  for (int i = 0; i < 21; ++i) r |= ((v >> i) & 1u) << (3 * i);
  return r;
}

__global__ void morton_kernel(const std::int32_t* coords, std::int64_t n, std::int64_t cols,
                              std::uint64_t* codes) {
  const std::int64_t first = cols == 4 ? 1 : 0;
  for (std::int64_t i = thread_index(); i < n; i += thread_stride()) {
    const std::int32_t* c = coords + cols * i + first;
    const std::uint64_t ux = static_cast<std::uint64_t>(c[0] + kMortonOffset);
    const std::uint64_t uy = static_cast<std::uint64_t>(c[1] + kMortonOffset);
    const std::uint64_t uz = static_cast<std::uint64_t>(c[2] + kMortonOffset);
    codes[i] = (spread3(ux) << 2) | (spread3(uy) << 1) | spread3(uz);
  }
}

__global__ void iota64(std::int64_t* v, std::int64_t n) {
  for (std::int64_t i = thread_index(); i < n; i += thread_stride()) v[i] = i;
}

__global__ void gather_batch(const std::int32_t* coords, const std::int64_t* rows, std::int64_t n,
                             std::int32_t* batch) {
  for (std::int64_t k = thread_index(); k < n; k += thread_stride()) batch[k] = coords[4 * rows[k]];
}

// Stable radix sort of (keys, values) pairs on `bits` low key bits.
template <class K>
void sort_pairs(const K* keys_in, K* keys_out, const std::int64_t* values_in, std::int64_t* values_out,
                std::int64_t n, int bits, Device device) {
  cudaStream_t s = stream_of(device);
  std::size_t temp_bytes = 0;
  LATTICE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_out, values_in,
                                                     values_out, n, 0, bits, s));
  Array temp = Array::empty({static_cast<std::int64_t>(temp_bytes > 0 ? temp_bytes : 1)}, Dtype::u8, device);
  LATTICE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.raw_data(), temp_bytes, keys_in, keys_out, values_in,
                                                     values_out, n, 0, bits, s));
}

// ---- select, collate, dense ----------------------------------------------------------------------

__global__ void select_flags(const std::uint8_t* mask, const std::int32_t* coords, std::int64_t n, Int3 lo,
                             Int3 hi, std::int64_t* flags) {
  for (std::int64_t i = thread_index(); i < n; i += thread_stride()) {
    bool keep = true;
    if (mask) keep = mask[i] != 0;
    if (keep && coords) {
      const std::int32_t* c = coords + 4 * i + 1;
      for (int axis = 0; axis < 3; ++axis) keep = keep && c[axis] >= lo[axis] && c[axis] < hi[axis];
    }
    flags[i] = keep ? 1 : 0;
  }
}

__global__ void scatter_index(const std::int64_t* flags, const std::int64_t* pos, std::int64_t n,
                              std::int64_t* out) {
  for (std::int64_t i = thread_index(); i < n; i += thread_stride())
    if (flags[i]) out[pos[i]] = i;
}

__global__ void collate_sample(const std::int32_t* coords, std::int64_t n, std::int64_t cols, std::int32_t batch,
                               std::int32_t* out) {
  for (std::int64_t r = thread_index(); r < n; r += thread_stride()) {
    const std::int32_t* c = coords + cols * r + (cols - 3);
    std::int32_t* o = out + 4 * r;
    o[0] = batch;
    o[1] = c[0];
    o[2] = c[1];
    o[3] = c[2];
  }
}

struct Size3 {
  std::int64_t v[3];
};

__global__ void dense_kernel(const std::int32_t* coords, std::int64_t n, Int3 origin, Size3 size,
                             std::int64_t* index) {
  for (std::int64_t i = thread_index(); i < n; i += thread_stride()) {
    const std::int32_t* c = coords + 4 * i;
    std::int64_t flat = c[0];
    for (int axis = 0; axis < 3; ++axis) flat = flat * size.v[axis] + (std::int64_t{c[axis + 1]} - origin[axis]);
    index[i] = flat;
  }
}

// ---- from_dense ----------------------------------------------------------------------------------

__global__ void site_flags(const std::uint8_t* site, std::int64_t n, std::int64_t* flags) {
  for (std::int64_t f = thread_index(); f < n; f += thread_stride()) flags[f] = site[f] != 0 ? 1 : 0;
}

// bounds[b] = number of non-zero sites before batch b, for b in [0, batch].
__global__ void batch_bounds(const std::int64_t* pos, std::int64_t batch, std::int64_t cells, std::int64_t total_sites,
                             std::int64_t kept, std::int64_t* bounds) {
  for (std::int64_t b = thread_index(); b <= batch; b += thread_stride()) {
    const std::int64_t f = b * cells;
    bounds[b] = f < total_sites ? pos[f] : kept;
  }
}

__global__ void write_sites(const std::int64_t* flags, const std::int64_t* pos, std::int64_t n, Size3 size,
                            Int3 origin, std::int32_t* coords, std::int64_t* index) {
  for (std::int64_t f0 = thread_index(); f0 < n; f0 += thread_stride()) {
    if (!flags[f0]) continue;
    const std::int64_t r = pos[f0];
    index[r] = f0;
    std::int64_t f = f0;
    const std::int64_t z = f % size.v[2];
    f /= size.v[2];
    const std::int64_t y = f % size.v[1];
    f /= size.v[1];
    const std::int64_t x = f % size.v[0];
    std::int32_t* o = coords + 4 * r;
    o[0] = static_cast<std::int32_t>(f / size.v[0]);
    o[1] = static_cast<std::int32_t>(x + origin[0]);
    o[2] = static_cast<std::int32_t>(y + origin[1]);
    o[3] = static_cast<std::int32_t>(z + origin[2]);
  }
}

}  // namespace

DownsampleResult coords_cuda_downsample(const DownsampleArgs& a) {
  const Device device = a.device;
  DeviceGuard guard(device.index);
  cudaStream_t s = stream_of(device);
  DownsampleResult out;
  Array strided = Array::empty({a.n, 4}, Dtype::i32, device);
  if (a.n > 0) {
    strided_rows<<<route_grid(a.n), kRouteThreads, 0, s>>>(a.coords, a.n, a.stride,
                                                         reinterpret_cast<Coord4*>(strided.data<std::int32_t>()));
    LATTICE_CUDA_CHECK_LAUNCH();
  }
  UniqueRows u = unique_first_occurrence(reinterpret_cast<const Coord4*>(strided.data<std::int32_t>()), a.n,
                                         device, true);
  out.coords = std::move(u.unique);
  out.inverse = Array::empty({a.n}, Dtype::i64, device);
  if (a.n > 0) {
    widen<<<route_grid(a.n), kRouteThreads, 0, s>>>(u.inverse.data<std::int32_t>(), a.n,
                                                  out.inverse.data<std::int64_t>());
    LATTICE_CUDA_CHECK_LAUNCH();
  }
  return out;
}

void coords_cuda_morton(const MortonArgs& a) {
  if (a.n == 0 || (!a.codes && !a.order)) return;
  const Device device = a.device;
  DeviceGuard guard(device.index);
  cudaStream_t s = stream_of(device);
  Array code_buf;
  std::uint64_t* codes = reinterpret_cast<std::uint64_t*>(a.codes);  // codes are non-negative
  if (!codes) {
    code_buf = Array::empty({a.n}, Dtype::i64, device);
    codes = reinterpret_cast<std::uint64_t*>(code_buf.raw_data());
  }
  morton_kernel<<<route_grid(a.n), kRouteThreads, 0, s>>>(a.coords, a.n, a.cols, codes);
  LATTICE_CUDA_CHECK_LAUNCH();
  if (!a.order) return;
  // Pass 1: stable by code (63 bits) from the identity order.
  Array iota = Array::empty({a.n}, Dtype::i64, device);
  Array sorted_codes = Array::empty({a.n}, Dtype::i64, device);
  iota64<<<route_grid(a.n), kRouteThreads, 0, s>>>(iota.data<std::int64_t>(), a.n);
  LATTICE_CUDA_CHECK_LAUNCH();
  if (a.cols != 4) {  // no batch column: batch 0 everywhere, the code order is the answer
    sort_pairs(const_cast<const std::uint64_t*>(codes), reinterpret_cast<std::uint64_t*>(sorted_codes.raw_data()),
               iota.data<std::int64_t>(), a.order, a.n, 63, device);
    return;
  }
  Array by_code = Array::empty({a.n}, Dtype::i64, device);
  sort_pairs(const_cast<const std::uint64_t*>(codes), reinterpret_cast<std::uint64_t*>(sorted_codes.raw_data()),
             iota.data<std::int64_t>(), by_code.data<std::int64_t>(), a.n, 63, device);
  // Pass 2: stable by batch (signed int32 keys), keeping the code order within a batch.
  Array batch = Array::empty({a.n}, Dtype::i32, device);
  Array sorted_batch = Array::empty({a.n}, Dtype::i32, device);
  gather_batch<<<route_grid(a.n), kRouteThreads, 0, s>>>(a.coords, by_code.data<std::int64_t>(), a.n,
                                                       batch.data<std::int32_t>());
  LATTICE_CUDA_CHECK_LAUNCH();
  sort_pairs(const_cast<const std::int32_t*>(batch.data<std::int32_t>()), sorted_batch.data<std::int32_t>(),
             by_code.data<std::int64_t>(), a.order, a.n, 32, device);
}

Array coords_cuda_select(const SelectArgs& a) {
  const Device device = a.device;
  DeviceGuard guard(device.index);
  cudaStream_t s = stream_of(device);
  Array flags = Array::empty({a.n}, Dtype::i64, device);
  Array pos = Array::empty({a.n}, Dtype::i64, device);
  if (a.n > 0) {
    select_flags<<<route_grid(a.n), kRouteThreads, 0, s>>>(a.mask, a.coords, a.n, a.lo, a.hi,
                                                         flags.data<std::int64_t>());
    LATTICE_CUDA_CHECK_LAUNCH();
  }
  const std::int64_t m = exclusive_count(flags.data<std::int64_t>(), pos.data<std::int64_t>(), a.n, device);
  Array out = Array::empty({m}, Dtype::i64, device);
  if (m > 0) {
    scatter_index<<<route_grid(a.n), kRouteThreads, 0, s>>>(flags.data<std::int64_t>(), pos.data<std::int64_t>(),
                                                          a.n, out.data<std::int64_t>());
    LATTICE_CUDA_CHECK_LAUNCH();
  }
  return out;
}

CollateResult coords_cuda_collate(const std::vector<CollateSample>& samples) {
  CollateResult out;
  const Device device = samples.empty() ? Device::cuda(0) : samples.front().device;
  DeviceGuard guard(device.index);
  cudaStream_t s = stream_of(device);
  std::int64_t total = 0;
  for (const CollateSample& smp : samples) {
    out.counts.push_back(smp.n);
    total += smp.n;
  }
  out.coords = Array::empty({total, 4}, Dtype::i32, device);
  std::int64_t row = 0;
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const CollateSample& smp = samples[i];
    if (smp.n > 0) {
      collate_sample<<<route_grid(smp.n), kRouteThreads, 0, s>>>(smp.coords, smp.n, smp.cols,
                                                               static_cast<std::int32_t>(i),
                                                               out.coords.data<std::int32_t>() + 4 * row);
      LATTICE_CUDA_CHECK_LAUNCH();
    }
    row += smp.n;
  }
  return out;
}

void coords_cuda_dense_index(const DenseIndexArgs& a) {
  if (a.n == 0) return;
  DeviceGuard guard(a.device.index);
  dense_kernel<<<route_grid(a.n), kRouteThreads, 0, stream_of(a.device)>>>(
      a.coords, a.n, a.origin, Size3{{a.size[0], a.size[1], a.size[2]}}, a.index);
  LATTICE_CUDA_CHECK_LAUNCH();
}

NonzeroResult coords_cuda_nonzero(const NonzeroArgs& a) {
  const Device device = a.device;
  DeviceGuard guard(device.index);
  cudaStream_t s = stream_of(device);
  NonzeroResult out;
  const std::int64_t cells = a.size[0] * a.size[1] * a.size[2];
  const std::int64_t total = a.batch * cells;
  out.counts.assign(static_cast<std::size_t>(a.batch), 0);
  Array flags = Array::empty({total}, Dtype::i64, device);
  Array pos = Array::empty({total}, Dtype::i64, device);
  if (total > 0) {
    site_flags<<<route_grid(total), kRouteThreads, 0, s>>>(a.site, total, flags.data<std::int64_t>());
    LATTICE_CUDA_CHECK_LAUNCH();
  }
  const std::int64_t k = exclusive_count(flags.data<std::int64_t>(), pos.data<std::int64_t>(), total, device);
  out.coords = Array::empty({k, 4}, Dtype::i32, device);
  out.index = Array::empty({k}, Dtype::i64, device);
  if (k == 0) return out;
  Array bounds = Array::empty({a.batch + 1}, Dtype::i64, device);
  batch_bounds<<<route_grid(a.batch + 1), kRouteThreads, 0, s>>>(pos.data<std::int64_t>(), a.batch, cells, total,
                                                                 k, bounds.data<std::int64_t>());
  LATTICE_CUDA_CHECK_LAUNCH();
  const Size3 size{{a.size[0], a.size[1], a.size[2]}};
  write_sites<<<route_grid(total), kRouteThreads, 0, s>>>(flags.data<std::int64_t>(), pos.data<std::int64_t>(),
                                                        total, size, a.origin, out.coords.data<std::int32_t>(),
                                                        out.index.data<std::int64_t>());
  LATTICE_CUDA_CHECK_LAUNCH();
  std::vector<std::int64_t> host_bounds(static_cast<std::size_t>(a.batch) + 1);
  copy_to_host(host_bounds.data(), bounds.raw_data(), sizeof(std::int64_t) * host_bounds.size(), device);
  for (std::int64_t b = 0; b < a.batch; ++b)
    out.counts[static_cast<std::size_t>(b)] = host_bounds[b + 1] - host_bounds[b];
  return out;
}

}  // namespace lattice::backend::cuda

LATTICE_ROUTE_KERNELS(CoordsKernels, coords_cuda, {
    .downsample = cuda::coords_cuda_downsample,
    .morton = cuda::coords_cuda_morton,
    .select = cuda::coords_cuda_select,
    .collate = cuda::coords_cuda_collate,
    .dense_index = cuda::coords_cuda_dense_index,
    .nonzero = cuda::coords_cuda_nonzero});
