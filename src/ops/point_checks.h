// Argument checks shared by the point-taking ops (sparse_quantize, voxelize,
// build_point_voxel_map); defined in quantize.cpp. Each raises `[op] argument: ...`.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "lattice/core/array.h"
#include "lattice/ops/quantize.h"

namespace lattice::ops::detail {

// points: defined, float32 or float64, shape (P, 3).
void check_points(std::string_view op, const Array& points);
// voxel_size: positive and finite per axis; origin: finite.
void check_grid(std::string_view op, const std::array<double, 3>& voxel_size,
                const std::array<double, 3>& origin);
// batch_indices (P) int32/int64 in [0, 2^31) on `device`, as a contiguous int32 copy; an
// undefined Array when `batch` is null or undefined.
Array checked_batch(std::string_view op, const Array* batch, std::int64_t n_points,
                    const Device& device);
// sparse_quantize with every error naming `op`.
QuantizeOutput quantize_points(std::string_view op, const Array& points,
                               const QuantizeOptions& options, const Array* batch_indices);

}  // namespace lattice::ops::detail
