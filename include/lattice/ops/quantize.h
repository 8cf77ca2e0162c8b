// Point -> voxel quantization (SEMANTICS.md "Point <-> voxel"), minimal version:
// v = floor((p - origin) / voxel_size) per axis, the batch id part of the key; unique voxel
// coordinates in first-occurrence order, the point -> voxel inverse and the per-voxel counts.
#pragma once

#include <array>

#include "lattice/core/array.h"
#include "lattice/route/route.h"

namespace lattice::ops {

struct QuantizeOptions {
  std::array<double, 3> voxel_size{1.0, 1.0, 1.0};
  std::array<double, 3> origin{0.0, 0.0, 0.0};
  RoutePolicy policy;
};

struct QuantizeOutput {
  Array coords;   // (M, 4) int32 (batch, x, y, z)
  Array inverse;  // (P) int64
  Array counts;   // (M) int64
};

// points (P, 3) float32/float64; batch_indices (P) int32/int64 >= 0 or null.
// NaN/inf points raise ValueError naming the first bad row.
QuantizeOutput sparse_quantize(const Array& points, const QuantizeOptions& options,
                               const Array* batch_indices = nullptr);

Explanation explain_quantize(const Array& points);

}  // namespace lattice::ops
