// Point <-> voxel conversion (SEMANTICS.md "Point <-> voxel").
//
// voxelize: points (P, 3) with features (P, C) -> a SparseTensor whose rows are sparse_quantize's
//   unique voxels (first-occurrence order, stride 1) and whose features are the sum, mean or
//   max of the voxel's point features. Differentiable in the features: sum -> dy[v], mean ->
//   dy[v] / count[v], max -> dy[v, c] to the first point holding the maximum of channel c (the
//   forward's tie rule: lowest point index wins; a NaN is the maximum), 0 to the others.
//
// build_point_voxel_map: points -> a reusable map onto the rows of a voxel tensor:
//   nearest   the voxel containing the point (the quantize floor rule), weight 1; -1 / 0 when
//             that voxel is absent. Column 0 holds it, columns 1..7 are -1 / 0.
//   trilinear the 8 voxels whose centres surround the point, corner k = dx*4 + dy*2 + dz
//             (x-major, z fastest); lower corner floor((p - origin) / size - 0.5), centre of v
//             (v + 0.5) * size + origin; weights are the trilinear products, missing voxels get
//             -1 / 0 and (normalize=true) the rest are divided by their sum; a point with no
//             present corner (or whose present corners all weigh 0) gets all zeros.
//   Stride rule: `voxel_size` is the size at stride 1 (what voxelize was given). A voxel tensor
//   at stride s has physical voxel size voxel_size * s: nearest looks up
//   floor_div(floor((p - origin) / voxel_size), s) (exactly how a strided conv maps the
//   coordinates) and trilinear uses size = voxel_size * s.
//
// devoxelize: out[p] = sum_k weights[p, k] * voxel_feats[indices[p, k]] (P, C); differentiable in
//   the voxel features (backward: a deterministic weighted segment sum over the map's
//   voxel-major CSR, built once with the map).
//
// Features f16, bf16, f32 (f64 for tests); f16/bf16 accumulate in f32. Points f32 or f64, batch
// ids (P) >= 0 are part of the voxel key. Every op picks a route of the "point_voxel" family.
#pragma once

#include <array>
#include <cstdint>
#include <memory>

#include "lattice/core/array.h"
#include "lattice/ops/quantize.h"
#include "lattice/route/route.h"
#include "lattice/tensor/coordinate_set.h"
#include "lattice/tensor/sparse_tensor.h"

namespace lattice::ops {

// Points grouped by voxel: sparse_quantize's outputs plus the CSR of points per voxel.
struct PointGrouping {
  std::shared_ptr<CoordinateSet> voxels;  // (M, 4) unique voxel coordinates, stride 1
  Array inverse;                          // (P) int64 point -> voxel row
  Array counts;                           // (M) int64 points per voxel
  Array voxel_ptr;                        // (M+1) int64
  Array point_idx;                        // (P) int64: points of voxel v, ascending
  std::int64_t n_points() const { return inverse.dim(0); }
  std::int64_t n_voxels() const { return counts.dim(0); }
};

// Quantizes and groups (no drop_invalid: NaN/inf points raise). `op` names the caller in errors.
PointGrouping group_points(const Array& points, const QuantizeOptions& options,
                           const Array* batch_indices = nullptr, std::string_view op = "voxelize");

struct VoxelizeOptions {
  std::array<double, 3> voxel_size{1.0, 1.0, 1.0};
  std::array<double, 3> origin{0.0, 0.0, 0.0};
  PointReduction reduction = PointReduction::mean;
  RoutePolicy policy;
};

struct VoxelizeForward {
  Array feats;   // (M, C) in the feature dtype
  Array argmax;  // (M, C) int64, max only: the point that holds each maximum
};
VoxelizeForward voxelize_forward(const PointGrouping& grouping, const Array& feats,
                                 PointReduction reduction, const RoutePolicy& policy = {});
// grad_out (M, C) -> (P, C). `argmax` is the forward's (max only).
Array voxelize_backward(const PointGrouping& grouping, const Array& grad_out, const Array& argmax,
                        PointReduction reduction, const RoutePolicy& policy = {});
// One call: group + forward.
SparseTensor voxelize(const Array& points, const Array& feats, const VoxelizeOptions& options,
                      const Array* batch_indices = nullptr);

struct PointVoxelMapOptions {
  std::array<double, 3> voxel_size{1.0, 1.0, 1.0};  // at stride 1 (see the stride rule above)
  std::array<double, 3> origin{0.0, 0.0, 0.0};
  PointVoxelMode mode = PointVoxelMode::nearest;
  bool normalize = true;  // trilinear: renormalise the present corners' weights to sum 1
  RoutePolicy policy;
};

// A map from P points onto the rows of one voxel coordinate set (identified by its key).
struct PointVoxelMap {
  PointVoxelMode mode = PointVoxelMode::nearest;
  bool normalize = true;
  std::uint64_t voxel_key = 0;  // the CoordinateSet it was built against
  std::int64_t n_points = 0;
  std::int64_t n_voxels = 0;
  Int3 stride{1, 1, 1};
  std::array<double, 3> voxel_size{1.0, 1.0, 1.0};
  std::array<double, 3> origin{0.0, 0.0, 0.0};
  Array indices;    // (P, 8) int64, -1 = missing
  Array weights;    // (P, 8) in the point dtype (float32 or float64)
  Array voxel_ptr;  // (M+1) int64 voxel-major CSR over the present entries
  Array entries;    // (E) int64 p*8 + k, ascending within each voxel
};

std::shared_ptr<const PointVoxelMap> build_point_voxel_map(
    const Array& points, const std::shared_ptr<CoordinateSet>& voxels,
    const PointVoxelMapOptions& options, const Array* batch_indices = nullptr);

// voxels: the coordinate set the map was built against, voxel_feats (M, C) -> (P, C).
Array devoxelize_forward(const PointVoxelMap& map, const std::shared_ptr<CoordinateSet>& voxels,
                         const Array& voxel_feats, const RoutePolicy& policy = {});
// grad_out (P, C) -> (M, C).
Array devoxelize_backward(const PointVoxelMap& map, const Array& grad_out,
                          const RoutePolicy& policy = {});
Array devoxelize(const SparseTensor& voxels, const PointVoxelMap& map,
                 const RoutePolicy& policy = {});

// Route decisions (nothing runs).
Explanation explain_voxelize(const PointGrouping& grouping, const Array& feats,
                             PointReduction reduction,
                             PointVoxelPass pass = PointVoxelPass::forward,
                             const RoutePolicy& policy = {});
Explanation explain_devoxelize(const PointVoxelMap& map, const Array& voxel_feats,
                               PointVoxelPass pass = PointVoxelPass::forward,
                               const RoutePolicy& policy = {});
Explanation explain_build_point_voxel_map(const Array& points,
                                          const std::shared_ptr<CoordinateSet>& voxels,
                                          PointVoxelMode mode, const RoutePolicy& policy = {});

}  // namespace lattice::ops
