// Point -> voxel quantization (SEMANTICS.md "Point <-> voxel"):
// v = floor((p - origin) / voxel_size) per axis, the batch id part of the key; unique voxel
// coordinates in first-occurrence order, the point -> voxel inverse and the per-voxel counts.
#pragma once

#include <array>

#include "lattice/core/array.h"
#include "lattice/route/route.h"

namespace lattice::ops {

struct QuantizeOptions {
  std::array<double, 3> voxel_size{1.0, 1.0, 1.0};  // positive, finite, per axis
  std::array<double, 3> origin{0.0, 0.0, 0.0};      // finite, subtracted before dividing
  // false: a NaN/inf point raises ValueError naming its row. true: such points are dropped;
  // the outputs are exactly those of the kept points alone, and `kept` marks them.
  bool drop_invalid = false;
  RoutePolicy policy;
};

struct QuantizeOutput {
  Array coords;   // (M, 4) int32 (batch, x, y, z)
  Array inverse;  // (P_kept) int64, kept point -> voxel row (P_kept = P without drop_invalid)
  Array counts;   // (M) int64
  Array kept;     // (P) bool with drop_invalid (false = dropped), undefined otherwise
};

// points (P, 3) float32/float64; batch_indices (P) int32/int64 >= 0 or null. A voxel index
// outside int32 raises ValueError (also with drop_invalid).
QuantizeOutput sparse_quantize(const Array& points, const QuantizeOptions& options,
                               const Array* batch_indices = nullptr);

Explanation explain_quantize(const Array& points);

}  // namespace lattice::ops
