// Constraints: CUDA device (needs_cuda: a CUDA build with a device); points float32 or float64
// (P, 3); optional int32 batch ids (P); any P (below 2^30). Deterministic: the same coordinates,
// inverse and counts as the CPU reference (unique voxel rows in first-occurrence order), bit for
// bit, on every run.
//
// One thread per point quantizes in float64 (v = floor((p - origin) / voxel_size),
// backend/common/point_voxel.h); the first non-finite point and the first out-of-int32 voxel
// are found with integer atomicMin (order-independent), and reported as the CPU route reports
// the first bad point in point order. With drop_invalid the kept points are compacted in order
// (flag scan). The unique rows and the inverse come from the device coordinate table
// (unique_first_occurrence: the smallest row per key, so first-occurrence order); counts are an
// integer histogram (atomicAdd on int64: the result does not depend on the order).
// Also here: batch_ids, the device check/narrowing of the batch ids of points.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "backend/common/geometry.h"
#include "backend/common/point_voxel.h"
#include "backend/cuda/common/compact.cuh"
#include "backend/cuda/common/coord_table.cuh"
#include "backend/cuda/point_voxel/point_voxel_routes.h"
#include "backend/cuda/runtime/check.h"
#include "backend/cuda/runtime/memory.h"
#include "backend/cuda/runtime/stream.h"
#include "backend/kernels.h"
#include "lattice/core/error.h"

namespace lattice::backend::cuda {
namespace {

#define LATTICE_GRID_STRIDE(i, n)                                                             \
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; \
       i < (n); i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)

struct Grid {
  double voxel_size[3];
  double origin[3];
};

struct Firsts {
  unsigned long long invalid;   // first non-finite point (~0: none)
  unsigned long long overflow;  // first finite point with an out-of-int32 voxel (~0: none)
};

// Quantizes every point: voxel[i] (when finite and in range), keep[i] = finite (int32 flag).
template <class P>
__global__ void quantize_kernel(std::int64_t n, const P* __restrict__ points,
                                const std::int32_t* __restrict__ batch, Grid g,
                                Coord4* __restrict__ voxels, std::int32_t* __restrict__ keep,
                                Firsts* firsts) {
  LATTICE_GRID_STRIDE(i, n) {
    const P* p = points + i * 3;
    bool finite = true;
    for (int d = 0; d < 3; ++d) finite = finite && isfinite(static_cast<double>(p[d]));
    keep[i] = finite ? 1 : 0;
    if (!finite) {
      atomicMin(&firsts->invalid, static_cast<unsigned long long>(i));
      continue;
    }
    std::int32_t v[3] = {0, 0, 0};
    bool fits = true;
    for (int d = 0; d < 3; ++d) {
      const double q = geometry::voxel_floor(static_cast<double>(p[d]), g.origin[d], g.voxel_size[d]);
      if (!geometry::voxel_index_fits(q)) {
        fits = false;
        break;
      }
      v[d] = static_cast<std::int32_t>(q);
    }
    if (!fits) atomicMin(&firsts->overflow, static_cast<unsigned long long>(i));
    voxels[i] = Coord4{batch ? batch[i] : 0, v[0], v[1], v[2]};
  }
}

__global__ void compact_kernel(std::int64_t n, const std::int32_t* __restrict__ keep,
                               const std::int32_t* __restrict__ pos, const Coord4* __restrict__ voxels,
                               Coord4* __restrict__ out, bool* __restrict__ kept) {
  LATTICE_GRID_STRIDE(i, n) {
    kept[i] = keep[i] != 0;
    if (keep[i]) out[pos[i]] = voxels[i];
  }
}

__global__ void inverse_counts_kernel(std::int64_t n, const std::int32_t* __restrict__ inverse32,
                                      std::int64_t* __restrict__ inverse,
                                      unsigned long long* __restrict__ counts) {
  LATTICE_GRID_STRIDE(i, n) {
    const std::int32_t v = inverse32[i];
    inverse[i] = v;
    atomicAdd(&counts[v], 1ULL);
  }
}

template <class I>
__global__ void batch_ids_kernel(std::int64_t n, const I* __restrict__ ids,
                                 std::int32_t* __restrict__ out, unsigned long long* bad) {
  LATTICE_GRID_STRIDE(i, n) {
    const std::int64_t v = static_cast<std::int64_t>(ids[i]);
    if (v < 0 || v > geometry::kInt32Max) atomicMin(bad, static_cast<unsigned long long>(i));
    out[i] = static_cast<std::int32_t>(v);
  }
}

template <class P>
QuantizeResult run(const QuantizeArgs& a) {
  QuantizeResult r;
  cudaStream_t s = stream_of(a.device);
  const std::int64_t n = a.n_points;
  Array voxels = Array::empty({n, 4}, Dtype::i32, a.device);
  Array keep = Array::empty({n}, Dtype::i32, a.device);
  auto* vox = reinterpret_cast<Coord4*>(voxels.data<std::int32_t>());
  Firsts firsts{~0ULL, ~0ULL};
  if (n > 0) {
    Array f = Array::empty({static_cast<std::int64_t>(sizeof(Firsts))}, Dtype::u8, a.device);
    LATTICE_CUDA_CHECK(cudaMemcpyAsync(f.raw_data(), &firsts, sizeof firsts, cudaMemcpyHostToDevice, s));
    Grid g{};
    for (int d = 0; d < 3; ++d) {
      g.voxel_size[d] = a.voxel_size[d];
      g.origin[d] = a.origin[d];
    }
    quantize_kernel<P><<<route_grid(n), kRouteThreads, 0, s>>>(
        n, static_cast<const P*>(a.points), a.batch, g, vox, keep.data<std::int32_t>(),
        static_cast<Firsts*>(f.raw_data()));
    LATTICE_CUDA_CHECK_LAUNCH();
    copy_to_host(&firsts, f.raw_data(), sizeof firsts, a.device);
  }
  // The CPU route stops at the first bad point in point order (a dropped point is not bad).
  if (!a.drop_invalid && firsts.invalid != ~0ULL &&
      (firsts.overflow == ~0ULL || firsts.invalid < firsts.overflow)) {
    r.first_invalid = static_cast<std::int64_t>(firsts.invalid);
    return r;
  }
  if (firsts.overflow != ~0ULL) {
    r.first_overflow = static_cast<std::int64_t>(firsts.overflow);
    return r;
  }
  const Coord4* candidates = vox;
  std::int64_t n_kept = n;
  Array compacted;
  if (a.drop_invalid) {
    r.kept = Array::empty({n}, Dtype::boolean, a.device);
    Array pos = Array::empty({n}, Dtype::i32, a.device);
    n_kept = exclusive_count(keep.data<std::int32_t>(), pos.data<std::int32_t>(), n, a.device);
    compacted = Array::empty({n_kept, 4}, Dtype::i32, a.device);
    if (n > 0) {
      compact_kernel<<<route_grid(n), kRouteThreads, 0, s>>>(
          n, keep.data<std::int32_t>(), pos.data<std::int32_t>(), vox,
          reinterpret_cast<Coord4*>(compacted.data<std::int32_t>()), r.kept.data<bool>());
      LATTICE_CUDA_CHECK_LAUNCH();
    }
    candidates = reinterpret_cast<const Coord4*>(compacted.data<std::int32_t>());
  }
  UniqueRows unique = unique_first_occurrence(candidates, n_kept, a.device, true);
  const std::int64_t m = unique.unique.dim(0);
  r.coords = std::move(unique.unique);
  r.inverse = Array::empty({n_kept}, Dtype::i64, a.device);
  r.counts = Array::empty({m}, Dtype::i64, a.device);
  if (m > 0) LATTICE_CUDA_CHECK(cudaMemsetAsync(r.counts.raw_data(), 0, r.counts.nbytes(), s));
  if (n_kept > 0) {
    inverse_counts_kernel<<<route_grid(n_kept), kRouteThreads, 0, s>>>(
        n_kept, unique.inverse.data<std::int32_t>(), r.inverse.data<std::int64_t>(),
        reinterpret_cast<unsigned long long*>(r.counts.data<std::int64_t>()));
    LATTICE_CUDA_CHECK_LAUNCH();
  }
  return r;
}

}  // namespace

QuantizeResult quantize(const QuantizeArgs& args) {
  LATTICE_ASSERT(args.device.is_cuda(), "sparse_quantize cuda: points are not on a cuda device");
  DeviceGuard guard(args.device.index);
  if (args.dtype == Dtype::f64) return run<double>(args);
  return run<float>(args);
}

BatchIdsResult batch_ids(const BatchIdsArgs& a) {
  LATTICE_ASSERT(a.device.is_cuda(), "batch_ids cuda: ids are not on a cuda device");
  LATTICE_ASSERT(a.dtype == Dtype::i32 || a.dtype == Dtype::i64, "batch_ids cuda: ids are not int32/int64");
  DeviceGuard guard(a.device.index);
  cudaStream_t s = stream_of(a.device);
  BatchIdsResult r;
  Array out = Array::empty({a.n}, Dtype::i32, a.device);
  if (a.n > 0) {
    Array bad = Array::empty({1}, Dtype::i64, a.device);
    LATTICE_CUDA_CHECK(cudaMemsetAsync(bad.raw_data(), 0xff, sizeof(std::int64_t), s));
    auto* bad_ptr = reinterpret_cast<unsigned long long*>(bad.raw_data());
    if (a.dtype == Dtype::i32)
      batch_ids_kernel<<<route_grid(a.n), kRouteThreads, 0, s>>>(
          a.n, static_cast<const std::int32_t*>(a.ids), out.data<std::int32_t>(), bad_ptr);
    else
      batch_ids_kernel<<<route_grid(a.n), kRouteThreads, 0, s>>>(
          a.n, static_cast<const std::int64_t*>(a.ids), out.data<std::int32_t>(), bad_ptr);
    LATTICE_CUDA_CHECK_LAUNCH();
    unsigned long long row = ~0ULL;
    copy_to_host(&row, bad.raw_data(), sizeof row, a.device);
    if (row != ~0ULL) {
      r.bad_row = static_cast<std::int64_t>(row);
      if (a.dtype == Dtype::i32) {
        std::int32_t v = 0;
        copy_to_host(&v, static_cast<const std::int32_t*>(a.ids) + row, sizeof v, a.device);
        r.bad_value = v;
      } else {
        copy_to_host(&r.bad_value, static_cast<const std::int64_t*>(a.ids) + row, sizeof r.bad_value,
                     a.device);
      }
      return r;
    }
  }
  r.batch = std::move(out);
  return r;
}

}  // namespace lattice::backend::cuda

LATTICE_ROUTE_KERNELS(QuantizeKernels, quantize_cuda, {.quantize = cuda::quantize});
