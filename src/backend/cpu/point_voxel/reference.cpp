// Constraints: CPU; features of any float dtype (f16, bf16, f32, f64); points float32 or
// float64; any number of points, voxels and channels (including none). Deterministic
// (single-threaded, fixed summation order).
//
// The scalar reference route of the point <-> voxel family: plain loops in point order, written
// to be obviously correct rather than fast. The parallel route is tested against it (bitwise:
// both add the terms of every output element in the same order).
//
// Shapes (named axes; P points, M voxels, C channels, W = 8 map columns):
//   voxelize   feats (P, C) -> out (M, C) [+ argmax (M, C) int64 for max]; dy (M, C) -> dfeats (P,
//   C) devoxelize voxel_feats (M, C) -> out (P, C); dy (P, C) -> dvoxel (M, C) map        points
//   (P, 3) -> indices (P, W) int64, weights (P, W) in the point dtype
// Numerics: sums in Accum<T> (f32 for f16/bf16/f32, f64 for f64), rounded to T once per output
// element. voxelize max keeps the first point holding the maximum (ties: the lowest point
// index); a NaN feature is the maximum (NaN propagates, the first NaN wins).
#include <cstdint>
#include <vector>

#include "backend/cpu/point_voxel/map_support.h"
#include "backend/kernels.h"

namespace lattice::backend::cpu {
namespace {

template <class A>
bool replaces_max(A candidate, A best) {
  return candidate > best || (candidate != candidate && best == best);
}

template <class T>
void voxelize_forward(const VoxelizeArgs& a) {
  using A = Accum<T>;
  const auto* x = static_cast<const T*>(a.feats);
  auto* out = static_cast<T*>(a.out);
  const std::int64_t c = a.channels;
  std::vector<A> acc(static_cast<std::size_t>(a.n_voxels * c), A{0});
  if (a.reduction == PointReduction::max) {
    std::vector<char> seen(static_cast<std::size_t>(a.n_voxels), 0);
    for (std::int64_t p = 0; p < a.n_points; ++p) {
      const std::int64_t v = a.inverse[p];
      for (std::int64_t j = 0; j < c; ++j) {
        const A xv = load(x[p * c + j]);
        A& best = acc[static_cast<std::size_t>(v * c + j)];
        if (!seen[static_cast<std::size_t>(v)] || replaces_max(xv, best)) {
          best = xv;
          a.argmax[v * c + j] = p;
        }
      }
      seen[static_cast<std::size_t>(v)] = 1;
    }
    for (std::int64_t e = 0; e < a.n_voxels * c; ++e)
      out[e] = store<T>(acc[static_cast<std::size_t>(e)]);
    return;
  }
  for (std::int64_t p = 0; p < a.n_points; ++p) {
    const std::int64_t v = a.inverse[p];
    for (std::int64_t j = 0; j < c; ++j)
      acc[static_cast<std::size_t>(v * c + j)] += load(x[p * c + j]);
  }
  for (std::int64_t v = 0; v < a.n_voxels; ++v) {
    for (std::int64_t j = 0; j < c; ++j) {
      A s = acc[static_cast<std::size_t>(v * c + j)];
      if (a.reduction == PointReduction::mean) s /= static_cast<A>(a.counts[v]);
      out[v * c + j] = store<T>(s);
    }
  }
}

template <class T>
void voxelize_backward(const VoxelizeArgs& a) {
  using A = Accum<T>;
  const auto* dy = static_cast<const T*>(a.dy);
  auto* dx = static_cast<T*>(a.dfeats);
  const std::int64_t c = a.channels;
  for (std::int64_t p = 0; p < a.n_points; ++p) {
    const std::int64_t v = a.inverse[p];
    for (std::int64_t j = 0; j < c; ++j) {
      const T g = dy[v * c + j];
      switch (a.reduction) {
        case PointReduction::sum:
          dx[p * c + j] = g;
          break;
        case PointReduction::mean:
          dx[p * c + j] = store<T>(load(g) / static_cast<A>(a.counts[v]));
          break;
        case PointReduction::max:
          dx[p * c + j] = a.argmax[v * c + j] == p ? g : store<T>(A{0});
          break;
      }
    }
  }
}

template <class T, class W>
void devoxelize_forward(const DevoxelizeArgs& a) {
  using A = Accum<T>;
  const auto* vf = static_cast<const T*>(a.voxel_feats);
  const auto* w = static_cast<const W*>(a.weights);
  auto* out = static_cast<T*>(a.out);
  const std::int64_t c = a.channels;
  std::vector<A> acc(static_cast<std::size_t>(c));
  for (std::int64_t p = 0; p < a.n_points; ++p) {
    for (std::int64_t j = 0; j < c; ++j) acc[static_cast<std::size_t>(j)] = A{0};
    for (std::int64_t k = 0; k < a.width; ++k) {
      const std::int64_t v = a.indices[p * a.width + k];
      if (v < 0) continue;
      const A wk = static_cast<A>(w[p * a.width + k]);
      for (std::int64_t j = 0; j < c; ++j)
        acc[static_cast<std::size_t>(j)] += wk * load(vf[v * c + j]);
    }
    for (std::int64_t j = 0; j < c; ++j)
      out[p * c + j] = store<T>(acc[static_cast<std::size_t>(j)]);
  }
}

template <class T, class W>
void devoxelize_backward(const DevoxelizeArgs& a) {
  using A = Accum<T>;
  const auto* dy = static_cast<const T*>(a.dy);
  const auto* w = static_cast<const W*>(a.weights);
  auto* dv = static_cast<T*>(a.dvoxel);
  const std::int64_t c = a.channels;
  std::vector<A> acc(static_cast<std::size_t>(a.n_voxels * c), A{0});
  for (std::int64_t p = 0; p < a.n_points; ++p) {
    for (std::int64_t k = 0; k < a.width; ++k) {
      const std::int64_t v = a.indices[p * a.width + k];
      if (v < 0) continue;
      const A wk = static_cast<A>(w[p * a.width + k]);
      for (std::int64_t j = 0; j < c; ++j)
        acc[static_cast<std::size_t>(v * c + j)] += wk * load(dy[p * c + j]);
    }
  }
  for (std::int64_t e = 0; e < a.n_voxels * c; ++e)
    dv[e] = store<T>(acc[static_cast<std::size_t>(e)]);
}

template <class P>
PointVoxelMapResult build_map(const PointVoxelMapArgs& a) {
  PointVoxelMapResult r;
  r.first_invalid = point_voxel::first_non_finite(static_cast<const P*>(a.points), a.n_points);
  if (r.first_invalid >= 0) return r;
  constexpr int kW = point_voxel::kWidth;
  r.indices = Array::empty({a.n_points, kW}, Dtype::i64);
  r.weights = Array::empty({a.n_points, kW}, a.dtype);
  auto* idx = r.indices.data<std::int64_t>();
  auto* wt = r.weights.data<P>();
  for (std::int64_t i = 0; i < a.n_points; ++i) {
    double w[kW];
    point_voxel::map_point<P>(a, i, idx + i * kW, w);
    for (int k = 0; k < kW; ++k) wt[i * kW + k] = static_cast<P>(w[k]);
  }
  point_voxel::build_voxel_major_csr(r, a.n_points, a.n_voxels);
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
  static void run(const DevoxelizeArgs& a) { devoxelize_forward<T, W>(a); }
};
template <class T, class W>
struct DevoxBackward {
  static void run(const DevoxelizeArgs& a) { devoxelize_backward<T, W>(a); }
};

}  // namespace

void voxelize_reference_forward(const VoxelizeArgs& args) {
  dispatch_float(args.dtype, "voxelize", "feats",
                 [&](auto tag) { voxelize_forward<typename decltype(tag)::type>(args); });
}

void voxelize_reference_backward(const VoxelizeArgs& args) {
  dispatch_float(args.dtype, "voxelize", "grad_out",
                 [&](auto tag) { voxelize_backward<typename decltype(tag)::type>(args); });
}

void devoxelize_reference_forward(const DevoxelizeArgs& args) {
  dispatch_devoxelize<DevoxForward>(args);
}
void devoxelize_reference_backward(const DevoxelizeArgs& args) {
  dispatch_devoxelize<DevoxBackward>(args);
}

PointVoxelMapResult point_voxel_map_reference(const PointVoxelMapArgs& args) {
  if (args.dtype == Dtype::f64) return build_map<double>(args);
  return build_map<float>(args);
}

}  // namespace lattice::backend::cpu

LATTICE_ROUTE_KERNELS(PointVoxelKernels, point_voxel_reference, {
    .voxelize_forward = cpu::voxelize_reference_forward,
    .voxelize_backward = cpu::voxelize_reference_backward,
    .devoxelize_forward = cpu::devoxelize_reference_forward,
    .devoxelize_backward = cpu::devoxelize_reference_backward,
    .build_map = cpu::point_voxel_map_reference});
