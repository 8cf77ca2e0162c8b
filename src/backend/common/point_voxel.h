// Host+device shared point <-> voxel geometry (SEMANTICS.md "Point <-> voxel"), in float64.
//
//   quantize / nearest:  v = floor((p - origin) / voxel_size) per axis; a voxel tensor at
//                        stride s holds floor_div(v, s) (what a strided conv does to coordinates).
//   trilinear:           the centre of voxel v at stride s is (v + 0.5) * voxel_size * s + origin;
//                        u = (p - origin) / (voxel_size * s) - 0.5, lower corner floor(u),
//                        fraction t = u - floor(u); corner k = (dx, dy, dz) with
//                        k = dx*4 + dy*2 + dz (x-major, z fastest, like kernel rows) has weight
//                        prod over axes of (d ? t : 1 - t).
// Points arrive as float32 or float64 and are widened to float64 (exactly) before any step, so
// every route and the numpy oracle take the same floor at voxel borders.
#pragma once

#include <cmath>
#include <cstdint>

#include "backend/common/geometry.h"

namespace lattice::geometry {

constexpr int kTrilinearCorners = 8;

// floor((x - origin) / size) in float64 (the caller range-checks before narrowing).
LATTICE_HD double voxel_floor(double x, double origin, double size) {
  return std::floor((x - origin) / size);
}

// True when the float64 voxel index fits int32 (false for NaN).
LATTICE_HD bool voxel_index_fits(double q) {
  return q >= static_cast<double>(kInt32Min) && q <= static_cast<double>(kInt32Max);
}

// The trilinear cell of one axis: lower corner index (float64, may be out of int32 range) and
// the fraction t in [0, 1).
struct TrilinearAxis {
  double lower;
  double t;
};

LATTICE_HD TrilinearAxis trilinear_axis(double x, double origin, double physical_size) {
  const double u = (x - origin) / physical_size - 0.5;
  const double lower = std::floor(u);
  return {lower, u - lower};
}

// Corner k's offset (0 or 1) along axis d (0 = x, 1 = y, 2 = z).
LATTICE_HD int corner_offset(int k, int d) { return (k >> (2 - d)) & 1; }

}  // namespace lattice::geometry
