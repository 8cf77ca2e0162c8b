// Constraints: CUDA device (needs_cuda: a CUDA build with a device); features of any float dtype
// (f16, bf16, f32, f64); points float32 or float64; any number of points, voxels and channels
// (including none); every pass (voxelize forward/backward, devoxelize forward/backward,
// build_map). Deterministic: no float atomics; bitwise-identical repeated runs, and the same
// per-element summation orders as the CPU routes (backend/kernels.h, PointVoxelKernels), with
// round-to-nearest adds and multiplies (no FMA), so the results match them bit for bit.
//
// One thread per output element (row, channel), consecutive threads on consecutive channels:
//   voxelize forward    (voxel, c): reduction over the voxel's points (CSR, points ascending);
//   voxelize backward   (point, c): a gather from dy[inverse[p]];
//   devoxelize forward  (point, c): weighted gather of the point's <= 8 voxels, k ascending;
//   devoxelize backward (voxel, c): weighted sum over the map's voxel-major CSR (p*8+k ascending);
//   map                 one thread per point (the rule of cpu/point_voxel/map_support.h, voxels
//                       found in the device coordinate table); the voxel-major CSR is a stable
//                       radix sort of (voxel row, entry) pairs.
// Also here: the CSR of points per voxel for PointGrouping (stable radix sort by voxel row).
//
// Shapes (named axes; P points, M voxels, C channels, W = 8 map columns): as in the CPU routes.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "backend/common/geometry.h"
#include "backend/common/point_voxel.h"
#include "backend/cuda/common/compact.cuh"
#include "backend/cuda/common/coord_table.cuh"
#include "backend/cuda/common/float16.cuh"
#include "backend/cuda/common/group_by_key.cuh"
#include "backend/cuda/point_voxel/point_voxel_routes.h"
#include "backend/cuda/runtime/check.h"
#include "backend/cuda/runtime/memory.h"
#include "backend/cuda/runtime/stream.h"
#include "backend/kernels.h"
#include "lattice/core/error.h"

namespace lattice::backend::cuda {
namespace {

constexpr int kWidth = geometry::kTrilinearCorners;

__device__ inline float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ inline double add_rn(double a, double b) { return __dadd_rn(a, b); }
__device__ inline float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ inline double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ inline float div_rn(float a, float b) { return __fdiv_rn(a, b); }
__device__ inline double div_rn(double a, double b) { return __ddiv_rn(a, b); }

#define LATTICE_GRID_STRIDE(i, n)                                                             \
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; \
       i < (n); i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)

template <class A>
__device__ inline bool replaces_max(A candidate, A best) {
  return candidate > best || (candidate != candidate && best == best);
}

// ---- voxelize ----------------------------------------------------------------------------------

template <class T>
__global__ void voxelize_forward_kernel(PointReduction reduction, std::int64_t m, std::int64_t C,
                                        const std::int64_t* __restrict__ voxel_ptr,
                                        const std::int64_t* __restrict__ point_idx,
                                        const std::int64_t* __restrict__ counts,
                                        const T* __restrict__ x, T* __restrict__ out,
                                        std::int64_t* __restrict__ argmax) {
  using A = Accum<T>;
  LATTICE_GRID_STRIDE(t, m * C) {
    const std::int64_t v = t / C, c = t - v * C;
    const std::int64_t begin = voxel_ptr[v], end = voxel_ptr[v + 1];
    if (reduction == PointReduction::max) {
      A best = A(0);
      std::int64_t best_p = -1;
      for (std::int64_t j = begin; j < end; ++j) {
        const std::int64_t p = point_idx[j];
        const A xv = dev_load(x[p * C + c]);
        if (best_p < 0 || replaces_max(xv, best)) {
          best = xv;
          best_p = p;
        }
      }
      out[t] = dev_store<T>(best);
      argmax[t] = best_p;
      continue;
    }
    A acc = A(0);
    for (std::int64_t j = begin; j < end; ++j) acc = add_rn(acc, dev_load(x[point_idx[j] * C + c]));
    if (reduction == PointReduction::mean) acc = div_rn(acc, static_cast<A>(counts[v]));
    out[t] = dev_store<T>(acc);
  }
}

template <class T>
__global__ void voxelize_backward_kernel(PointReduction reduction, std::int64_t n, std::int64_t C,
                                         const std::int64_t* __restrict__ inverse,
                                         const std::int64_t* __restrict__ counts,
                                         const std::int64_t* __restrict__ argmax,
                                         const T* __restrict__ dy, T* __restrict__ dx) {
  using A = Accum<T>;
  LATTICE_GRID_STRIDE(t, n * C) {
    const std::int64_t p = t / C, c = t - p * C;
    const std::int64_t vc = inverse[p] * C + c;
    const T g = dy[vc];
    switch (reduction) {
      case PointReduction::sum:
        dx[t] = g;
        break;
      case PointReduction::mean:
        dx[t] = dev_store<T>(div_rn(dev_load(g), static_cast<A>(counts[inverse[p]])));
        break;
      case PointReduction::max:
        dx[t] = argmax[vc] == p ? g : dev_store<T>(A(0));
        break;
    }
  }
}

// ---- devoxelize --------------------------------------------------------------------------------

template <class T, class W>
__global__ void devoxelize_forward_kernel(std::int64_t n, std::int64_t C, std::int64_t width,
                                          const std::int64_t* __restrict__ indices,
                                          const W* __restrict__ weights,
                                          const T* __restrict__ vf, T* __restrict__ out) {
  using A = Accum<T>;
  LATTICE_GRID_STRIDE(t, n * C) {
    const std::int64_t p = t / C, c = t - p * C;
    A acc = A(0);
    for (std::int64_t k = 0; k < width; ++k) {
      const std::int64_t v = indices[p * width + k];
      if (v < 0) continue;
      acc = add_rn(acc, mul_rn(static_cast<A>(weights[p * width + k]), dev_load(vf[v * C + c])));
    }
    out[t] = dev_store<T>(acc);
  }
}

template <class T, class W>
__global__ void devoxelize_backward_kernel(std::int64_t m, std::int64_t C, std::int64_t width,
                                           const std::int64_t* __restrict__ voxel_ptr,
                                           const std::int64_t* __restrict__ entries,
                                           const W* __restrict__ weights,
                                           const T* __restrict__ dy, T* __restrict__ dv) {
  using A = Accum<T>;
  LATTICE_GRID_STRIDE(t, m * C) {
    const std::int64_t v = t / C, c = t - v * C;
    A acc = A(0);
    for (std::int64_t j = voxel_ptr[v]; j < voxel_ptr[v + 1]; ++j) {
      const std::int64_t e = entries[j];
      const std::int64_t p = e / width;
      acc = add_rn(acc, mul_rn(static_cast<A>(weights[e]), dev_load(dy[p * C + c])));
    }
    dv[t] = dev_store<T>(acc);
  }
}

// ---- build_point_voxel_map ---------------------------------------------------------------------

template <class P>
__global__ void first_non_finite_kernel(std::int64_t n, const P* __restrict__ points,
                                        unsigned long long* first) {
  LATTICE_GRID_STRIDE(i, n) {
    bool finite = true;
    for (int d = 0; d < 3; ++d) finite = finite && isfinite(static_cast<double>(points[i * 3 + d]));
    if (!finite) atomicMin(first, static_cast<unsigned long long>(i));
  }
}

struct MapGeometry {
  double voxel_size[3];
  double physical[3];  // voxel_size * stride (as the CPU rule computes it)
  double origin[3];
  std::int32_t stride[3];
  PointVoxelMode mode;
  bool normalize;
};

// Map row of point i (cpu/point_voxel/map_support.h map_point, on the device).
template <class P>
__global__ void map_kernel(std::int64_t n, const P* __restrict__ points,
                           const std::int32_t* __restrict__ batch, MapGeometry g, CoordTableView voxels,
                           std::int64_t* __restrict__ indices, P* __restrict__ weights,
                           std::uint32_t* __restrict__ keys, std::uint32_t missing_key) {
  LATTICE_GRID_STRIDE(i, n) {
    const P* p = points + i * 3;
    const std::int32_t b = batch ? batch[i] : 0;
    std::int64_t idx[kWidth];
    double w[kWidth];
    for (int k = 0; k < kWidth; ++k) {
      idx[k] = -1;
      w[k] = 0.0;
    }
    if (g.mode == PointVoxelMode::nearest) {
      std::int32_t v[3];
      bool fits = true;
      for (int d = 0; d < 3; ++d) {
        const double q = geometry::voxel_floor(static_cast<double>(p[d]), g.origin[d], g.voxel_size[d]);
        if (!geometry::voxel_index_fits(q)) {
          fits = false;
          break;
        }
        v[d] = static_cast<std::int32_t>(geometry::floor_div(static_cast<std::int64_t>(q), g.stride[d]));
      }
      if (fits) {
        idx[0] = table_find(voxels, Coord4{b, v[0], v[1], v[2]});
        w[0] = idx[0] >= 0 ? 1.0 : 0.0;
      }
    } else {
      geometry::TrilinearAxis ax[3];
      for (int d = 0; d < 3; ++d)
        ax[d] = geometry::trilinear_axis(static_cast<double>(p[d]), g.origin[d], g.physical[d]);
      double sum = 0.0;
      for (int k = 0; k < kWidth; ++k) {
        double c[3];
        double raw = 1.0;
        bool fits = true;
        for (int d = 0; d < 3; ++d) {
          const int o = geometry::corner_offset(k, d);
          c[d] = __dadd_rn(ax[d].lower, static_cast<double>(o));
          fits = fits && geometry::voxel_index_fits(c[d]);
          raw = __dmul_rn(raw, o ? ax[d].t : __dsub_rn(1.0, ax[d].t));
        }
        if (!fits) continue;
        const std::int32_t r =
            table_find(voxels, Coord4{b, static_cast<std::int32_t>(c[0]), static_cast<std::int32_t>(c[1]),
                                      static_cast<std::int32_t>(c[2])});
        if (r < 0) continue;
        idx[k] = r;
        w[k] = raw;
        sum = __dadd_rn(sum, raw);
      }
      if (g.normalize)
        for (int k = 0; k < kWidth; ++k) w[k] = sum > 0.0 ? __ddiv_rn(w[k], sum) : 0.0;
    }
    for (int k = 0; k < kWidth; ++k) {
      indices[i * kWidth + k] = idx[k];
      weights[i * kWidth + k] = static_cast<P>(w[k]);
      keys[i * kWidth + k] = idx[k] >= 0 ? static_cast<std::uint32_t>(idx[k]) : missing_key;
    }
  }
}

template <class P>
PointVoxelMapResult build_map(const PointVoxelMapArgs& a) {
  PointVoxelMapResult r;
  cudaStream_t s = stream_of(a.device);
  const std::int64_t n = a.n_points, m = a.n_voxels;
  const auto* pts = static_cast<const P*>(a.points);
  if (n > 0) {
    Array first = Array::empty({1}, Dtype::i64, a.device);
    LATTICE_CUDA_CHECK(cudaMemsetAsync(first.raw_data(), 0xff, sizeof(std::int64_t), s));
    first_non_finite_kernel<P><<<route_grid(n), kRouteThreads, 0, s>>>(
        n, pts, reinterpret_cast<unsigned long long*>(first.raw_data()));
    LATTICE_CUDA_CHECK_LAUNCH();
    unsigned long long got = ~0ULL;
    copy_to_host(&got, first.raw_data(), sizeof got, a.device);
    if (got != ~0ULL) {
      r.first_invalid = static_cast<std::int64_t>(got);
      return r;
    }
  }
  CoordTable table;
  if (a.voxel_slots) {  // the voxel set's cached index (rows already checked unique)
    table.rows = reinterpret_cast<const Coord4*>(a.voxel_coords);
    table.n = m;
    table.mask = a.voxel_mask;
  } else {
    table = build_coord_table(reinterpret_cast<const Coord4*>(a.voxel_coords), m, a.device);
    const DuplicatePair dup = find_duplicate(table, a.device);
    if (dup.row >= 0) {
      r.duplicate_row = dup.row;
      r.duplicate_first = dup.first;
      return r;
    }
  }
  CoordTableView view = table.view();
  if (a.voxel_slots) view.slots = const_cast<std::int32_t*>(a.voxel_slots);
  const std::int64_t slots = n * kWidth;
  r.indices = Array::empty({n, kWidth}, Dtype::i64, a.device);
  r.weights = Array::empty({n, kWidth}, a.dtype, a.device);
  r.voxel_ptr = Array::empty({m + 1}, Dtype::i64, a.device);
  if (n == 0) {
    LATTICE_CUDA_CHECK(cudaMemsetAsync(r.voxel_ptr.raw_data(), 0, r.voxel_ptr.nbytes(), s));
    r.entries = Array::empty({0}, Dtype::i64, a.device);
    return r;
  }
  MapGeometry g{};
  for (int d = 0; d < 3; ++d) {
    g.voxel_size[d] = a.voxel_size[d];
    g.physical[d] = a.voxel_size[d] * a.stride[d];
    g.origin[d] = a.origin[d];
    g.stride[d] = a.stride[d];
  }
  g.mode = a.mode;
  g.normalize = a.normalize;
  Array keys = Array::empty({slots}, Dtype::i32, a.device);
  auto* key_ptr = reinterpret_cast<std::uint32_t*>(keys.data<std::int32_t>());
  map_kernel<P><<<route_grid(n), kRouteThreads, 0, s>>>(n, pts, a.batch, g, view,
                                                          r.indices.data<std::int64_t>(),
                                                          r.weights.data<P>(), key_ptr,
                                                          static_cast<std::uint32_t>(m));
  LATTICE_CUDA_CHECK_LAUNCH();
  // Voxel-major CSR: entries sorted stably by voxel row (missing entries carry key m, last).
  Array ids = Array::empty({slots}, Dtype::i64, a.device);
  Array sorted_ids = Array::empty({slots}, Dtype::i64, a.device);
  Array sorted_keys = Array::empty({slots}, Dtype::i32, a.device);
  auto* sk = reinterpret_cast<std::uint32_t*>(sorted_keys.data<std::int32_t>());
  fill_iota(ids.data<std::int64_t>(), slots, a.device);
  stable_sort_pairs(static_cast<const std::uint32_t*>(key_ptr), sk, ids.data<std::int64_t>(),
                    sorted_ids.data<std::int64_t>(), slots, key_bits(m), a.device);
  csr_from_sorted_keys(sk, slots, m, r.voxel_ptr.data<std::int64_t>(), a.device);
  std::int64_t total = 0;
  copy_to_host(&total, r.voxel_ptr.data<std::int64_t>() + m, sizeof total, a.device);
  r.entries = Array::empty({total}, Dtype::i64, a.device);
  if (total > 0)
    LATTICE_CUDA_CHECK(cudaMemcpyAsync(r.entries.raw_data(), sorted_ids.raw_data(),
                                       static_cast<std::size_t>(total) * sizeof(std::int64_t),
                                       cudaMemcpyDeviceToDevice, s));
  return r;
}

template <template <class, class> class Fn>
void dispatch_devoxelize(const DevoxelizeArgs& a) {
  dispatch_float(a.dtype, "devoxelize", "feats", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (a.weight_dtype == Dtype::f64)
      Fn<T, double>::run(a);
    else
      Fn<T, float>::run(a);
  });
}

template <class T, class W>
struct DevoxForward {
  static void run(const DevoxelizeArgs& a) {
    if (a.n_points * a.channels == 0) return;
    devoxelize_forward_kernel<T, W><<<route_grid(a.n_points * a.channels), kRouteThreads, 0,
                                      stream_of(a.device)>>>(
        a.n_points, a.channels, a.width, a.indices, static_cast<const W*>(a.weights),
        static_cast<const T*>(a.voxel_feats), static_cast<T*>(a.out));
    LATTICE_CUDA_CHECK_LAUNCH();
  }
};
template <class T, class W>
struct DevoxBackward {
  static void run(const DevoxelizeArgs& a) {
    if (a.n_voxels * a.channels == 0) return;
    devoxelize_backward_kernel<T, W><<<route_grid(a.n_voxels * a.channels), kRouteThreads, 0,
                                       stream_of(a.device)>>>(
        a.n_voxels, a.channels, a.width, a.voxel_ptr, a.entries, static_cast<const W*>(a.weights),
        static_cast<const T*>(a.dy), static_cast<T*>(a.dvoxel));
    LATTICE_CUDA_CHECK_LAUNCH();
  }
};

void check_device(const Device& d, const char* what) {
  LATTICE_ASSERT(d.is_cuda(), std::string(what) + ": arrays are not on a cuda device");
}

}  // namespace

void voxelize_forward(const VoxelizeArgs& a) {
  check_device(a.device, "voxelize cuda");
  DeviceGuard guard(a.device.index);
  if (a.n_voxels * a.channels == 0) return;
  dispatch_float(a.dtype, "voxelize", "feats", [&](auto tag) {
    using T = typename decltype(tag)::type;
    voxelize_forward_kernel<T><<<route_grid(a.n_voxels * a.channels), kRouteThreads, 0,
                                 stream_of(a.device)>>>(
        a.reduction, a.n_voxels, a.channels, a.voxel_ptr, a.point_idx, a.counts,
        static_cast<const T*>(a.feats), static_cast<T*>(a.out), a.argmax);
    LATTICE_CUDA_CHECK_LAUNCH();
  });
}

void voxelize_backward(const VoxelizeArgs& a) {
  check_device(a.device, "voxelize cuda");
  DeviceGuard guard(a.device.index);
  if (a.n_points * a.channels == 0) return;
  dispatch_float(a.dtype, "voxelize", "grad_out", [&](auto tag) {
    using T = typename decltype(tag)::type;
    voxelize_backward_kernel<T><<<route_grid(a.n_points * a.channels), kRouteThreads, 0,
                                  stream_of(a.device)>>>(
        a.reduction, a.n_points, a.channels, a.inverse, a.counts, a.argmax,
        static_cast<const T*>(a.dy), static_cast<T*>(a.dfeats));
    LATTICE_CUDA_CHECK_LAUNCH();
  });
}

void devoxelize_forward(const DevoxelizeArgs& a) {
  check_device(a.device, "devoxelize cuda");
  DeviceGuard guard(a.device.index);
  dispatch_devoxelize<DevoxForward>(a);
}

void devoxelize_backward(const DevoxelizeArgs& a) {
  check_device(a.device, "devoxelize cuda");
  DeviceGuard guard(a.device.index);
  dispatch_devoxelize<DevoxBackward>(a);
}

PointVoxelMapResult point_voxel_map(const PointVoxelMapArgs& a) {
  check_device(a.device, "build_point_voxel_map cuda");
  LATTICE_ASSERT(a.voxel_coords != nullptr || a.n_voxels == 0,
                 "build_point_voxel_map cuda: voxel_coords is null");
  DeviceGuard guard(a.device.index);
  if (a.dtype == Dtype::f64) return build_map<double>(a);
  return build_map<float>(a);
}

PointGroupResult group_points_by_voxel(const PointGroupArgs& a) {
  check_device(a.device, "group_points cuda");
  DeviceGuard guard(a.device.index);
  PointGroupResult r;
  const std::int64_t n = a.n_points, m = a.n_voxels;
  r.voxel_ptr = Array::empty({m + 1}, Dtype::i64, a.device);
  r.point_idx = Array::empty({n}, Dtype::i64, a.device);
  if (n == 0) {
    LATTICE_CUDA_CHECK(cudaMemsetAsync(r.voxel_ptr.raw_data(), 0, r.voxel_ptr.nbytes(), stream_of(a.device)));
    return r;
  }
  Array ids = Array::empty({n}, Dtype::i64, a.device);
  Array sorted = Array::empty({n}, Dtype::i64, a.device);
  auto* sk = reinterpret_cast<std::uint64_t*>(sorted.data<std::int64_t>());
  fill_iota(ids.data<std::int64_t>(), n, a.device);
  stable_sort_pairs(reinterpret_cast<const std::uint64_t*>(a.inverse), sk, ids.data<std::int64_t>(),
                    r.point_idx.data<std::int64_t>(), n, key_bits(m > 0 ? m - 1 : 0), a.device);
  csr_from_sorted_keys(sk, n, m, r.voxel_ptr.data<std::int64_t>(), a.device);
  return r;
}

}  // namespace lattice::backend::cuda

LATTICE_ROUTE_KERNELS(PointVoxelKernels, point_voxel_cuda, {
    .voxelize_forward = cuda::voxelize_forward,
    .voxelize_backward = cuda::voxelize_backward,
    .devoxelize_forward = cuda::devoxelize_forward,
    .devoxelize_backward = cuda::devoxelize_backward,
    .build_map = cuda::point_voxel_map});
