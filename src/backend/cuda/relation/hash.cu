// Constraints: CUDA (data on a cuda device, the CUDA backend built and a device present);
// contiguous (N, 4) int32 coordinate rows, any int32 values; every relation kind, any kernel
// volume, any row count (including none). Deterministic: the index, the supports, edges and
// orderings are bitwise equal to the cpu_hash route's, run to run (integer atomics only count
// or take minima).
//
// The relation route cuda_hash: coordinate sets and relations built on a CUDA device, mirroring
// the cpu_hash route (src/backend/cpu/relation/hash.cpp) rule for rule (gather / scatter lookups, first-occurrence output supports, orderings), so a device
// relation is bitwise equal to the CPU one built from the same coordinates.
//
// Every kernel is a grid-stride loop with 64-bit indices (n_out * K may exceed 2^31). Orderings
// come from scans, never from atomics: the output-major list from a per-row count scan, the
// per-offset grouping by compacting the map in k-major order, the input grouping by compacting
// an (offset, input row) -> output row table in k-major order (within one offset every input
// row occurs at most once). Integer atomics only count or take minima (order-independent).
// A build stores the map alone; each other view is one entry point, run when the relation is
// first asked for it (lattice/tensor/relation.h "Views"); only device_count_edges reads back (and
// device_edges queues its count's copy to pinned memory: PendingCount, no wait).

#include <cub/device/device_reduce.cuh>
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <string>

#include "backend/common/geometry.h"
#include "backend/cuda/common/coord_table.cuh"
#include "backend/cuda/common/group_by_key.cuh"
#include "backend/cuda/runtime/memory.h"
#include "backend/cuda/runtime/stream.h"
#include "backend/kernels.h"
#include "lattice/core/error.h"

namespace lattice::backend::cuda {

namespace {

constexpr int kThreads = 256;
constexpr unsigned long long kNone = ~0ULL;

// A per-axis int64 triple passed by value to kernels.
struct Axis3 {
  long long v[3];
};
Axis3 axis3(const std::array<std::int64_t, 3>& a) { return {{a[0], a[1], a[2]}}; }

unsigned grid_for(std::int64_t n) {
  const unsigned b = blocks_for(n, kThreads);
  return b > 65535u * 16u ? 65535u * 16u : b;  // grid-stride loops cover the rest
}

#define LATTICE_GRID_STRIDE(i, n)                                                              \
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)

const Coord4* rows_of(const Array& coords) {
  return reinterpret_cast<const Coord4*>(coords.data<std::int32_t>());
}

// In-place exclusive prefix sum over n > 0 int64 values.
void exclusive_sum_inplace(std::int64_t* data, std::int64_t n, Device device) {
  cudaStream_t s = stream_of(device);
  std::size_t bytes = 0;
  LATTICE_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, bytes, data, n, s));
  Array temp = Array::empty({static_cast<std::int64_t>(std::max<std::size_t>(bytes, 16))}, Dtype::u8, device);
  LATTICE_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp.raw_data(), bytes, data, n, s));
}

// out[j] = in[0] + ... + in[j] over n > 0 int64 values.
void inclusive_sum(const std::int64_t* in, std::int64_t* out, std::int64_t n, Device device) {
  cudaStream_t s = stream_of(device);
  std::size_t bytes = 0;
  LATTICE_CUDA_CHECK(cub::DeviceScan::InclusiveSum(nullptr, bytes, in, out, n, s));
  Array temp = Array::empty({static_cast<std::int64_t>(std::max<std::size_t>(bytes, 16))}, Dtype::u8, device);
  LATTICE_CUDA_CHECK(cub::DeviceScan::InclusiveSum(temp.raw_data(), bytes, in, out, n, s));
}

// A CSR pointer (n + 1 int64) from n per-row counts: ptr[0] = 0, ptr[j + 1] = sum of counts[0..j].
Array csr_from_counts(const Array& counts, std::int64_t n, Device device) {
  Array ptr = Array::empty({n + 1}, Dtype::i64, device);
  LATTICE_CUDA_CHECK(cudaMemsetAsync(ptr.raw_data(), 0, sizeof(std::int64_t), stream_of(device)));
  if (n > 0) inclusive_sum(counts.data<std::int64_t>(), ptr.data<std::int64_t>() + 1, n, device);
  return ptr;
}

std::int64_t read_i64(const std::int64_t* p, Device device) {
  std::int64_t v = 0;
  copy_to_host(&v, p, sizeof v, device);
  return v;
}

// ---- coordinate sets -----------------------------------------------------------------------

__global__ void batch_histogram_kernel(const Coord4* rows, std::int64_t n, std::int64_t n_batches,
                                       unsigned long long* counts, unsigned long long* bad) {
  LATTICE_GRID_STRIDE(r, n) {
    const std::int32_t b = rows[r].b;
    if (b < 0 || b >= n_batches) {
      atomicMin(bad, static_cast<unsigned long long>(r));
    } else {
      atomicAdd(&counts[b], 1ULL);
    }
  }
}

// ---- output supports -----------------------------------------------------------------------

__global__ void downsample_kernel(const Coord4* in, std::int64_t n, Axis3 s, Coord4* out) {
  LATTICE_GRID_STRIDE(i, n) {
    const Coord4 c = in[i];
    out[i] = Coord4{c.b, static_cast<std::int32_t>(geometry::floor_div(c.x, s.v[0])),
                    static_cast<std::int32_t>(geometry::floor_div(c.y, s.v[1])),
                    static_cast<std::int32_t>(geometry::floor_div(c.z, s.v[2]))};
  }
}

// The candidate of (input row i, kernel row k) for expand / transposed supports. Returns false
// when it does not exist (expand: not divisible on some axis); `o` then is unspecified.
__host__ __device__ inline bool support_candidate(const Coord4& c, std::int64_t k, const KernelSpec& spec,
                                                  bool centered, const Axis3& s, const Axis3& p, bool expand,
                                                  std::int64_t o[3]) {
  std::int64_t off[3];
  geometry::kernel_offset(k, spec, centered, off);
  const std::int64_t cc[3] = {c.x, c.y, c.z};
  for (int a = 0; a < 3; ++a) {
    if (expand) {
      const std::int64_t num = cc[a] + p.v[a] - off[a];
      o[a] = geometry::floor_div(num, s.v[a]);
      if (o[a] * s.v[a] != num) return false;
    } else {
      o[a] = cc[a] * s.v[a] + off[a] - p.v[a];
    }
  }
  return true;
}

// Candidate t = i * K + k (input row major, then kernel row). flags[t] (expand only) = 1 when
// the candidate exists; overflow = the smallest t whose candidate leaves int32.
__global__ void candidates_kernel(const Coord4* in, std::int64_t n_in, std::int64_t K, KernelSpec spec,
                                  bool centered, Axis3 s, Axis3 p, bool expand, Coord4* cand,
                                  std::int64_t* flags, unsigned long long* overflow) {
  LATTICE_GRID_STRIDE(t, n_in * K) {
    const std::int64_t i = t / K;
    const std::int64_t k = t - i * K;
    const Coord4 c = in[i];
    std::int64_t o[3];
    bool valid = support_candidate(c, k, spec, centered, s, p, expand, o);
    if (valid && !(geometry::fits_int32(o[0]) && geometry::fits_int32(o[1]) && geometry::fits_int32(o[2]))) {
      atomicMin(overflow, static_cast<unsigned long long>(t));
      valid = false;
    }
    if (valid) {
      cand[t] = Coord4{c.b, static_cast<std::int32_t>(o[0]), static_cast<std::int32_t>(o[1]),
                       static_cast<std::int32_t>(o[2])};
    }
    if (flags) flags[t] = valid ? 1 : 0;
  }
}

// pos: exclusive scan of the flags (n + 1 entries); candidate t is kept iff pos[t + 1] != pos[t].
__global__ void compact_kernel(const Coord4* cand, const std::int64_t* pos, std::int64_t n, Coord4* out) {
  LATTICE_GRID_STRIDE(t, n) {
    if (pos[t + 1] != pos[t]) out[pos[t]] = cand[t];
  }
}

// ---- edges ---------------------------------------------------------------------------------

// map[o * K + k]: the input row feeding (o, k), or -1 (relation.cpp find_edges).
__global__ void map_kernel(CoordTableView table, bool has_input, const Coord4* out, std::int64_t n_out,
                           std::int64_t K, KernelSpec spec, bool centered, Axis3 s, Axis3 p, bool scatter,
                           std::int32_t* map, unsigned long long* count) {
  LATTICE_GRID_STRIDE(t, n_out * K) {
    const std::int64_t o = t / K;
    const std::int64_t k = t - o * K;
    const Coord4 oc = out[o];
    std::int64_t off[3];
    geometry::kernel_offset(k, spec, centered, off);
    const std::int64_t occ[3] = {oc.x, oc.y, oc.z};
    std::int64_t want[3] = {0, 0, 0};
    bool exists = has_input;
    for (int a = 0; a < 3 && exists; ++a) {
      if (scatter) {
        const std::int64_t d = occ[a] - off[a] + p.v[a];
        want[a] = geometry::floor_div(d, s.v[a]);
        exists = want[a] * s.v[a] == d;
      } else {
        want[a] = occ[a] * s.v[a] + off[a] - p.v[a];
      }
      exists = exists && geometry::fits_int32(want[a]);
    }
    const std::int32_t found = exists ? table_find(table, Coord4{oc.b, static_cast<std::int32_t>(want[0]),
                                                               static_cast<std::int32_t>(want[1]),
                                                               static_cast<std::int32_t>(want[2])})
                                      : -1;
    map[t] = found;
    if (count) {  // the edge count: one integer atomic per warp step (order-independent)
      const unsigned active = __activemask();
      const unsigned hits = __ballot_sync(active, found >= 0);
      if (hits && (threadIdx.x & 31) == static_cast<unsigned>(__ffs(active) - 1))
        atomicAdd(count, static_cast<unsigned long long>(__popc(hits)));
    }
  }
}

__global__ void row_count_kernel(const std::int32_t* map, std::int64_t n_out, std::int64_t K,
                                 std::int64_t* counts) {
  LATTICE_GRID_STRIDE(o, n_out) {
    std::int64_t c = 0;
    for (std::int64_t k = 0; k < K; ++k) c += map[o * K + k] >= 0;
    counts[o] = c;
  }
}

// The output-major edge list, sorted by (o, k).
__global__ void output_major_kernel(const std::int32_t* map, std::int64_t n_out, std::int64_t K,
                                    const std::int64_t* out_ptr, std::int32_t* in_idx, std::int32_t* out_idx,
                                    std::int32_t* k_idx) {
  LATTICE_GRID_STRIDE(o, n_out) {
    std::int64_t e = out_ptr[o];
    for (std::int64_t k = 0; k < K; ++k) {
      const std::int32_t i = map[o * K + k];
      if (i < 0) continue;
      in_idx[e] = i;
      out_idx[e] = static_cast<std::int32_t>(o);
      k_idx[e] = static_cast<std::int32_t>(k);
      ++e;
    }
  }
}

// pos[k * n_out + o] = 1 when (o, k) has an edge; pos[K * n_out] = 0 (the scan's total).
__global__ void k_major_flags_kernel(const std::int32_t* map, std::int64_t n_out, std::int64_t K,
                                     std::int64_t* pos) {
  LATTICE_GRID_STRIDE(t, n_out * K + 1) {
    if (t == n_out * K) {
      pos[t] = 0;
    } else {
      const std::int64_t k = t / n_out;
      const std::int64_t o = t - k * n_out;
      pos[t] = map[o * K + k] >= 0 ? 1 : 0;
    }
  }
}

// k_ptr[k] = start of column k in the k-major compaction (k = K: the edge count).
__global__ void k_ptr_kernel(const std::int64_t* pos, std::int64_t n_out, std::int64_t K, std::int64_t* k_ptr) {
  LATTICE_GRID_STRIDE(k, K + 1) { k_ptr[k] = pos[k * n_out]; }
}

// The per-offset grouping, sorted by (k, o).
__global__ void per_offset_kernel(const std::int32_t* map, const std::int64_t* pos, std::int64_t n_out,
                                  std::int64_t K, std::int32_t* k_in, std::int32_t* k_out) {
  LATTICE_GRID_STRIDE(t, n_out * K) {
    const std::int64_t k = t / n_out;
    const std::int64_t o = t - k * n_out;
    const std::int32_t i = map[o * K + k];
    if (i >= 0) {
      const std::int64_t e = pos[t];
      k_in[e] = i;
      k_out[e] = static_cast<std::int32_t>(o);
    }
  }
}

// K == 1 and n_in == n_out: the relation is the identity iff map[o] == o for every row.
__global__ void identity_mismatch_kernel(const std::int32_t* map, std::int64_t n, int* mismatch) {
  LATTICE_GRID_STRIDE(o, n) {
    if (map[o] != o) atomicOr(mismatch, 1);
  }
}

// map[o * K + k] = i  ->  inv[i * K + k] = o (no conflicts: each (input row, offset) holds at
// most one edge).
__global__ void input_map_kernel(const std::int32_t* map, std::int64_t n_out, std::int64_t K, std::int32_t* inv) {
  LATTICE_GRID_STRIDE(t, n_out * K) {
    const std::int32_t i = map[t];
    if (i >= 0) {
      const std::int64_t o = t / K;
      inv[static_cast<std::int64_t>(i) * K + (t - o * K)] = static_cast<std::int32_t>(o);
    }
  }
}

__global__ void mirror_map_kernel(const std::int32_t* map, std::int64_t n, std::int64_t K, std::int32_t* out) {
  LATTICE_GRID_STRIDE(t, n * K) {
    const std::int64_t r = t / K;
    out[t] = map[r * K + (K - 1 - (t - r * K))];
  }
}

// ---- lazily built views --------------------------------------------------------------------

__global__ void row_masks_kernel(const std::int32_t* map, std::int64_t n_out, std::int64_t K, std::int64_t words,
                                 unsigned long long* bits) {
  LATTICE_GRID_STRIDE(t, n_out * words) {
    const std::int64_t o = t / words;
    const std::int64_t w = t - o * words;
    const std::int64_t k0 = w * 64;
    const std::int64_t k1 = k0 + 64 < K ? k0 + 64 : K;
    unsigned long long word = 0;
    for (std::int64_t k = k0; k < k1; ++k) {
      if (map[o * K + k] >= 0) word |= 1ULL << (k - k0);
    }
    bits[t] = word;
  }
}

__global__ void input_count_kernel(const std::int32_t* in_idx, std::int64_t n_edges, unsigned long long* counts) {
  LATTICE_GRID_STRIDE(e, n_edges) { atomicAdd(&counts[in_idx[e]], 1ULL); }
}

// inv[k * n_in + i] = the output row of edge (i, o, k), from the per-offset grouping (edge e's
// offset is the k with k_ptr[k] <= e < k_ptr[k + 1]); each (k, i) holds at most one edge.
__global__ void inverse_table_kernel(const std::int64_t* k_ptr, std::int64_t K, const std::int32_t* k_in,
                                     const std::int32_t* k_out, std::int64_t n_edges, std::int64_t n_in,
                                     std::int32_t* inv) {
  LATTICE_GRID_STRIDE(e, n_edges) {
    std::int64_t lo = 0, hi = K;  // the last k with k_ptr[k] <= e
    while (hi - lo > 1) {
      const std::int64_t mid = (lo + hi) / 2;
      if (k_ptr[mid] <= e) lo = mid; else hi = mid;
    }
    inv[lo * n_in + k_in[e]] = k_out[e];
  }
}

__global__ void inverse_flags_kernel(const std::int32_t* inv, std::int64_t n, std::int64_t* pos) {
  LATTICE_GRID_STRIDE(t, n + 1) { pos[t] = t < n && inv[t] >= 0 ? 1 : 0; }
}

// Within offset k (column k of inv) the edges come out sorted by input row.
__global__ void input_grouping_kernel(const std::int32_t* inv, const std::int64_t* pos, std::int64_t n,
                                      std::int64_t n_in, std::int32_t* kt_in, std::int32_t* kt_out) {
  LATTICE_GRID_STRIDE(t, n) {
    const std::int32_t o = inv[t];
    if (o >= 0) {
      const std::int64_t e = pos[t];
      kt_in[e] = static_cast<std::int32_t>(t % n_in);
      kt_out[e] = o;
    }
  }
}

}  // namespace

// ---- entry points (backend::RelationKernels of the cuda_hash route) ------------------------

DeviceCoordTable device_build_table(const Array& coords) {
  const Device device = coords.device();
  DeviceGuard guard(device.index);
  CoordTable t = build_coord_table(rows_of(coords), coords.dim(0), device);
  DeviceCoordTable table;
  table.slots = t.slots;
  table.mask = t.mask;
  return table;
}

DuplicateRow device_find_duplicate(const Array& coords, const DeviceCoordTable& table) {
  const Device device = coords.device();
  DeviceGuard guard(device.index);
  CoordTable t;
  t.slots = table.slots;
  t.mask = table.mask;
  t.rows = rows_of(coords);
  t.n = coords.dim(0);
  const DuplicatePair pair = find_duplicate(t, device);
  DuplicateRow out;
  if (pair.row < 0) return out;
  out.row = pair.row;
  out.first = pair.first;
  copy_to_host(&out.value, t.rows + pair.row, sizeof(Coord4), device);
  return out;
}

BatchHistogram device_batch_histogram(const Array& coords, std::int64_t n_batches) {
  const Device device = coords.device();
  DeviceGuard guard(device.index);
  BatchHistogram h;
  h.counts.assign(static_cast<std::size_t>(n_batches), 0);
  const std::int64_t n = coords.dim(0);
  if (n == 0) return h;
  cudaStream_t s = stream_of(device);
  Array counts = Array::zeros({std::max<std::int64_t>(n_batches, 1)}, Dtype::i64, device);
  Array bad = Array::empty({1}, Dtype::i64, device);
  LATTICE_CUDA_CHECK(cudaMemsetAsync(bad.raw_data(), 0xff, sizeof(std::int64_t), s));
  batch_histogram_kernel<<<grid_for(n), kThreads, 0, s>>>(
      rows_of(coords), n, n_batches, reinterpret_cast<unsigned long long*>(counts.raw_data()),
      reinterpret_cast<unsigned long long*>(bad.raw_data()));
  LATTICE_CUDA_CHECK_LAUNCH();
  unsigned long long bad_row = kNone;
  copy_to_host(&bad_row, bad.raw_data(), sizeof bad_row, device);
  if (bad_row != kNone) {
    h.bad_row = static_cast<std::int64_t>(bad_row);
    copy_to_host(&h.bad_batch, coords.data<std::int32_t>() + 4 * h.bad_row, sizeof(std::int32_t), device);
    return h;
  }
  if (n_batches > 0) {
    copy_to_host(h.counts.data(), counts.raw_data(), static_cast<std::size_t>(n_batches) * sizeof(std::int64_t),
                 device);
  }
  return h;
}

DeviceSupportResult device_support(const DeviceSupportArgs& args) {
  const Device device = args.coords.device();
  DeviceGuard guard(device.index);
  cudaStream_t s = stream_of(device);
  const std::int64_t n_in = args.coords.dim(0);
  const Coord4* in = rows_of(args.coords);
  const Axis3 stride = axis3(args.stride);
  const Axis3 padding = axis3(args.padding);
  DeviceSupportResult result;

  if (args.rule == SupportRule::downsample) {
    Array cand = Array::empty({n_in, 4}, Dtype::i32, device);
    if (n_in > 0) {
      downsample_kernel<<<grid_for(n_in), kThreads, 0, s>>>(in, n_in, stride,
                                                            reinterpret_cast<Coord4*>(cand.data<std::int32_t>()));
      LATTICE_CUDA_CHECK_LAUNCH();
    }
    result.coords = unique_first_occurrence(rows_of(cand), n_in, device, false).unique;
    return result;
  }

  const bool expand = args.rule == SupportRule::expand;
  const std::int64_t K = args.spec.volume();
  const std::int64_t total = n_in * K;
  Array cand = Array::empty({total, 4}, Dtype::i32, device);
  Array flags;  // expand: (total + 1) int64, the existence flags, then their exclusive scan
  if (expand) flags = Array::empty({total + 1}, Dtype::i64, device);
  if (total > 0) {
    Array overflow = Array::empty({1}, Dtype::i64, device);
    LATTICE_CUDA_CHECK(cudaMemsetAsync(overflow.raw_data(), 0xff, sizeof(std::int64_t), s));
    candidates_kernel<<<grid_for(total), kThreads, 0, s>>>(
        in, n_in, K, args.spec, args.centered, stride, padding, expand,
        reinterpret_cast<Coord4*>(cand.data<std::int32_t>()), expand ? flags.data<std::int64_t>() : nullptr,
        reinterpret_cast<unsigned long long*>(overflow.raw_data()));
    LATTICE_CUDA_CHECK_LAUNCH();
    unsigned long long first = kNone;
    copy_to_host(&first, overflow.raw_data(), sizeof first, device);
    if (first != kNone) {
      // Recompute that candidate on the host to name its first out-of-range coordinate.
      const auto t = static_cast<std::int64_t>(first);
      const std::int64_t i = t / K;
      Coord4 c{};
      copy_to_host(&c, in + i, sizeof c, device);
      std::int64_t o[3];
      support_candidate(c, t - i * K, args.spec, args.centered, stride, padding, expand, o);
      result.overflow_row = i;
      for (int a = 0; a < 3; ++a) {
        if (!geometry::fits_int32(o[a])) {
          result.overflow_value = o[a];
          break;
        }
      }
      return result;
    }
  }

  if (!expand) {
    result.coords = unique_first_occurrence(rows_of(cand), total, device, false).unique;
    return result;
  }
  // expand: keep the candidates that exist (in order), then deduplicate.
  LATTICE_CUDA_CHECK(cudaMemsetAsync(flags.data<std::int64_t>() + total, 0, sizeof(std::int64_t), s));
  exclusive_sum_inplace(flags.data<std::int64_t>(), total + 1, device);
  const std::int64_t kept = read_i64(flags.data<std::int64_t>() + total, device);
  Array compact = Array::empty({kept, 4}, Dtype::i32, device);
  if (kept > 0) {
    compact_kernel<<<grid_for(total), kThreads, 0, s>>>(rows_of(cand), flags.data<std::int64_t>(), total,
                                                        reinterpret_cast<Coord4*>(compact.data<std::int32_t>()));
    LATTICE_CUDA_CHECK_LAUNCH();
  }
  result.coords = unique_first_occurrence(rows_of(compact), kept, device, false).unique;
  return result;
}

DeviceEdges device_edges(const DeviceEdgeArgs& args) {
  const Device device = args.output.device();
  DeviceGuard guard(device.index);
  cudaStream_t s = stream_of(device);
  const std::int64_t n_in = args.input.dim(0);
  const std::int64_t n_out = args.output.dim(0);
  const std::int64_t K = args.kernel_volume;
  const std::int64_t pairs = n_out * K;
  DeviceEdges r;
  r.n_edges = args.known_edges;  // -1: counted on first use (device_count_edges)

  // The (n_out, K) map, the relation's one stored view. The identity (the caller's hint: K == 1
  // onto the input's own unique rows) maps every row to itself, which is what the lookup would
  // find: no hashing, no read-back.
  r.map = Array::empty({n_out, K}, Dtype::i32, device);
  if (args.known_identity) {
    LATTICE_ASSERT(K == 1 && n_in == n_out, "identity hint on a relation that cannot be the identity");
    if (n_out > 0) fill_iota(r.map.data<std::int32_t>(), n_out, device);
    r.identity = true;
    r.n_edges = n_out;
    return r;
  }
  // Unless the count is known or this is a 1x1 relation (checked for the identity below), the map
  // kernel counts the edges and the count travels to pinned host memory behind an event
  // (PendingCount): the relation's first n_edges() takes it without a stream synchronisation.
  Array counter;
  if (pairs > 0 && r.n_edges < 0 && !(K == 1 && n_in == n_out)) counter = Array::zeros({1}, Dtype::i64, device);
  if (pairs > 0) {
    CoordTableView view{rows_of(args.input),
                        args.input_table && args.input_table->slots.defined()
                            ? args.input_table->slots.data<std::int32_t>()
                            : nullptr,
                        args.input_table ? args.input_table->mask : 0};
    const bool has_input = n_in > 0 && view.slots != nullptr;
    map_kernel<<<grid_for(pairs), kThreads, 0, s>>>(view, has_input, rows_of(args.output), n_out, K, args.spec,
                                                    args.centered, axis3(args.stride), axis3(args.padding),
                                                    args.scatter, r.map.data<std::int32_t>(),
                                                    counter.defined()
                                                        ? reinterpret_cast<unsigned long long*>(counter.raw_data())
                                                        : nullptr);
    LATTICE_CUDA_CHECK_LAUNCH();
    if (counter.defined()) r.pending_edges = copy_count_async(counter.data<std::int64_t>(), device);
  }
  // identity: K == 1 onto as many rows, each reaching itself (one read-back, 1x1 relations only).
  if (K == 1 && n_in == n_out) {
    if (n_out == 0) {
      r.identity = true;
    } else {
      Array mismatch = Array::zeros({1}, Dtype::i32, device);
      identity_mismatch_kernel<<<grid_for(n_out), kThreads, 0, s>>>(r.map.data<std::int32_t>(), n_out,
                                                                    reinterpret_cast<int*>(mismatch.raw_data()));
      LATTICE_CUDA_CHECK_LAUNCH();
      int flag = 1;
      copy_to_host(&flag, mismatch.raw_data(), sizeof flag, device);
      r.identity = flag == 0;
    }
    if (r.identity) r.n_edges = n_out;
  }
  return r;
}

// Edges per row of a map: (n) int64 counts.
static Array row_counts(const Array& map, Device device) {
  const std::int64_t n = map.dim(0);
  Array counts = Array::empty({n}, Dtype::i64, device);
  if (n > 0) {
    row_count_kernel<<<grid_for(n), kThreads, 0, stream_of(device)>>>(map.data<std::int32_t>(), n, map.dim(1),
                                                                       counts.data<std::int64_t>());
    LATTICE_CUDA_CHECK_LAUNCH();
  }
  return counts;
}

std::int64_t device_count_edges(const Array& map) {
  const Device device = map.device();
  DeviceGuard guard(device.index);
  const std::int64_t n = map.dim(0);
  if (n == 0 || map.dim(1) == 0) return 0;
  const Array counts = row_counts(map, device);
  cudaStream_t s = stream_of(device);
  Array total = Array::empty({1}, Dtype::i64, device);
  std::size_t bytes = 0;
  LATTICE_CUDA_CHECK(cub::DeviceReduce::Sum(nullptr, bytes, counts.data<std::int64_t>(),
                                            total.data<std::int64_t>(), n, s));
  Array temp = Array::empty({static_cast<std::int64_t>(std::max<std::size_t>(bytes, 16))}, Dtype::u8, device);
  LATTICE_CUDA_CHECK(cub::DeviceReduce::Sum(temp.raw_data(), bytes, counts.data<std::int64_t>(),
                                            total.data<std::int64_t>(), n, s));
  return read_i64(total.data<std::int64_t>(), device);
}

Array device_row_ptr(const Array& map) {
  const Device device = map.device();
  DeviceGuard guard(device.index);
  return csr_from_counts(row_counts(map, device), map.dim(0), device);
}

// The output-major list by the row CSR (no read-back: the caller knows the count).
DeviceEdgeList device_edge_list(const Array& map, const Array& row_ptr, std::int64_t n_edges) {
  const Device device = map.device();
  DeviceGuard guard(device.index);
  const std::int64_t n_out = map.dim(0);
  DeviceEdgeList r;
  r.in_idx = Array::empty({n_edges}, Dtype::i32, device);
  r.out_idx = Array::empty({n_edges}, Dtype::i32, device);
  r.k_idx = Array::empty({n_edges}, Dtype::i32, device);
  if (n_edges > 0) {
    output_major_kernel<<<grid_for(n_out), kThreads, 0, stream_of(device)>>>(
        map.data<std::int32_t>(), n_out, map.dim(1), row_ptr.data<std::int64_t>(), r.in_idx.data<std::int32_t>(),
        r.out_idx.data<std::int32_t>(), r.k_idx.data<std::int32_t>());
    LATTICE_CUDA_CHECK_LAUNCH();
  }
  return r;
}

// The per-offset grouping: the map compacted in k-major order. With the count known, no
// read-back; without it, k_ptr (K + 1 values) is read back once: the count and the host bounds.
DeviceOffsetGrouping device_per_offset(const Array& map, std::int64_t n_edges) {
  const Device device = map.device();
  DeviceGuard guard(device.index);
  cudaStream_t s = stream_of(device);
  const std::int64_t n_out = map.dim(0);
  const std::int64_t K = map.dim(1);
  const std::int64_t pairs = n_out * K;
  DeviceOffsetGrouping r;
  if (n_edges == 0 || pairs == 0) {
    r.k_ptr = Array::zeros({K + 1}, Dtype::i64, device);
    r.k_in = Array::empty({0}, Dtype::i32, device);
    r.k_out = Array::empty({0}, Dtype::i32, device);
    if (n_edges < 0) r.host_k_ptr.assign(static_cast<std::size_t>(K + 1), 0);
    return r;
  }
  const std::int32_t* m = map.data<std::int32_t>();
  Array pos = Array::empty({pairs + 1}, Dtype::i64, device);
  k_major_flags_kernel<<<grid_for(pairs + 1), kThreads, 0, s>>>(m, n_out, K, pos.data<std::int64_t>());
  LATTICE_CUDA_CHECK_LAUNCH();
  exclusive_sum_inplace(pos.data<std::int64_t>(), pairs + 1, device);
  r.k_ptr = Array::empty({K + 1}, Dtype::i64, device);
  k_ptr_kernel<<<grid_for(K + 1), kThreads, 0, s>>>(pos.data<std::int64_t>(), n_out, K, r.k_ptr.data<std::int64_t>());
  LATTICE_CUDA_CHECK_LAUNCH();
  if (n_edges < 0) {
    r.host_k_ptr.resize(static_cast<std::size_t>(K + 1));
    copy_to_host(r.host_k_ptr.data(), r.k_ptr.raw_data(), static_cast<std::size_t>(K + 1) * sizeof(std::int64_t),
                 device);
    n_edges = r.host_k_ptr.back();
  }
  r.k_in = Array::empty({n_edges}, Dtype::i32, device);
  r.k_out = Array::empty({n_edges}, Dtype::i32, device);
  if (n_edges > 0) {
    per_offset_kernel<<<grid_for(pairs), kThreads, 0, s>>>(m, pos.data<std::int64_t>(), n_out, K,
                                                           r.k_in.data<std::int32_t>(), r.k_out.data<std::int32_t>());
    LATTICE_CUDA_CHECK_LAUNCH();
  }
  return r;
}

Array device_input_map(const Array& map, std::int64_t n_in) {
  const Device device = map.device();
  DeviceGuard guard(device.index);
  cudaStream_t s = stream_of(device);
  const std::int64_t n_out = map.dim(0);
  const std::int64_t K = map.dim(1);
  Array inv = Array::empty({n_in, K}, Dtype::i32, device);
  if (n_in * K > 0) {
    LATTICE_CUDA_CHECK(cudaMemsetAsync(inv.raw_data(), 0xff, static_cast<std::size_t>(n_in * K) * 4, s));
  }
  if (n_out * K > 0 && n_in > 0) {
    input_map_kernel<<<grid_for(n_out * K), kThreads, 0, s>>>(map.data<std::int32_t>(), n_out, K,
                                                              inv.data<std::int32_t>());
    LATTICE_CUDA_CHECK_LAUNCH();
  }
  return inv;
}

// The map with its offsets reversed (a submanifold relation's input-side map; see kernels.h).
Array device_mirror_map(const Array& map) {
  const Device device = map.device();
  DeviceGuard guard(device.index);
  const std::int64_t n = map.dim(0);
  const std::int64_t K = map.dim(1);
  Array out = Array::empty({n, K}, Dtype::i32, device);
  if (n * K > 0) {
    mirror_map_kernel<<<grid_for(n * K), kThreads, 0, stream_of(device)>>>(map.data<std::int32_t>(), n, K,
                                                                          out.data<std::int32_t>());
    LATTICE_CUDA_CHECK_LAUNCH();
  }
  return out;
}

Array device_row_masks(const Array& map) {
  const Device device = map.device();
  DeviceGuard guard(device.index);
  const std::int64_t n_out = map.dim(0);
  const std::int64_t K = map.dim(1);
  const std::int64_t words = (K + 63) / 64;
  Array masks = Array::empty({n_out, words}, Dtype::i64, device);
  if (n_out * words > 0) {
    row_masks_kernel<<<grid_for(n_out * words), kThreads, 0, stream_of(device)>>>(
        map.data<std::int32_t>(), n_out, K, words, reinterpret_cast<unsigned long long*>(masks.raw_data()));
    LATTICE_CUDA_CHECK_LAUNCH();
  }
  return masks;
}

// Rows stably sorted by their offset mask (the row_masks word, K <= 64; CUB's LSD radix sort is
// stable): equal to the cpu_hash route's order bitwise. No read-back.
Array device_row_order(const Array& map) {
  const Device device = map.device();
  DeviceGuard guard(device.index);
  const std::int64_t n = map.dim(0);
  const std::int64_t K = map.dim(1);
  if (K > 64) return Array();
  if (n == 0) return Array::empty({0}, Dtype::i32, device);
  const Array masks = device_row_masks(map);  // (n, 1) words: the keys
  Array sorted_keys = Array::empty({n}, Dtype::i64, device);
  Array iota = Array::empty({n}, Dtype::i32, device);
  Array order = Array::empty({n}, Dtype::i32, device);
  fill_iota(iota.data<std::int32_t>(), n, device);
  stable_sort_pairs(reinterpret_cast<const std::uint64_t*>(masks.raw_data()),
                    reinterpret_cast<std::uint64_t*>(sorted_keys.raw_data()), iota.data<std::int32_t>(),
                    order.data<std::int32_t>(), n, static_cast<int>(K), device);
  return order;
}

DeviceInputGrouping device_input_grouping(const DeviceInputGroupingArgs& args) {
  const Device device = args.k_ptr.device();
  DeviceGuard guard(device.index);
  cudaStream_t s = stream_of(device);
  const std::int64_t n_in = args.n_in;
  const std::int64_t K = args.kernel_volume;
  const std::int64_t E = args.n_edges;
  DeviceInputGrouping g;

  // Edges per input row as a CSR pointer (integer counts: independent of the atomics' order);
  // k_in holds every edge's input row once.
  Array counts = Array::zeros({n_in}, Dtype::i64, device);
  if (E > 0) {
    input_count_kernel<<<grid_for(E), kThreads, 0, s>>>(args.k_in.data<std::int32_t>(), E,
                                                        reinterpret_cast<unsigned long long*>(counts.raw_data()));
    LATTICE_CUDA_CHECK_LAUNCH();
  }
  g.in_ptr = csr_from_counts(counts, n_in, device);

  g.kt_in = Array::empty({E}, Dtype::i32, device);
  g.kt_out = Array::empty({E}, Dtype::i32, device);
  if (E == 0) return g;
  // (offset, input row) -> output row, compacted in k-major order: offset k's edges land at
  // k_ptr[k] (its edge count is the count of column k) sorted by input row.
  const std::int64_t cells = K * n_in;
  Array inv = Array::empty({cells}, Dtype::i32, device);
  LATTICE_CUDA_CHECK(cudaMemsetAsync(inv.raw_data(), 0xff, static_cast<std::size_t>(cells) * sizeof(std::int32_t), s));
  inverse_table_kernel<<<grid_for(E), kThreads, 0, s>>>(args.k_ptr.data<std::int64_t>(), K,
                                                        args.k_in.data<std::int32_t>(),
                                                        args.k_out.data<std::int32_t>(), E, n_in,
                                                        inv.data<std::int32_t>());
  LATTICE_CUDA_CHECK_LAUNCH();
  Array pos = Array::empty({cells + 1}, Dtype::i64, device);
  inverse_flags_kernel<<<grid_for(cells + 1), kThreads, 0, s>>>(inv.data<std::int32_t>(), cells,
                                                                pos.data<std::int64_t>());
  LATTICE_CUDA_CHECK_LAUNCH();
  exclusive_sum_inplace(pos.data<std::int64_t>(), cells + 1, device);
  input_grouping_kernel<<<grid_for(cells), kThreads, 0, s>>>(inv.data<std::int32_t>(), pos.data<std::int64_t>(),
                                                             cells, n_in, g.kt_in.data<std::int32_t>(),
                                                             g.kt_out.data<std::int32_t>());
  LATTICE_CUDA_CHECK_LAUNCH();
  return g;
}

}  // namespace lattice::backend::cuda

LATTICE_ROUTE_KERNELS(RelationKernels, relation_cuda_hash, {
    .build_table = cuda::device_build_table,
    .find_duplicate = cuda::device_find_duplicate,
    .batch_histogram = cuda::device_batch_histogram,
    .support = cuda::device_support,
    .edges = cuda::device_edges,
    .count_edges = cuda::device_count_edges,
    .row_ptr = cuda::device_row_ptr,
    .edge_list = cuda::device_edge_list,
    .per_offset = cuda::device_per_offset,
    .row_masks = cuda::device_row_masks,
    .input_grouping = cuda::device_input_grouping,
    .input_map = cuda::device_input_map,
    .mirror_map = cuda::device_mirror_map,
    .row_order = cuda::device_row_order});
