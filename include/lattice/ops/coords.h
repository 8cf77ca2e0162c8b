// Coordinate utilities (SEMANTICS.md "Sparse algebra and coordinate utilities"): set operations
// and lookups by coordinate value (through the algebra routes), downsampling and Morton codes
// (through the coords routes). Coordinates are (N, 4) int32 rows (batch, x, y, z) on the CPU.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "lattice/core/array.h"
#include "lattice/core/vocab.h"
#include "lattice/route/route.h"
#include "lattice/tensor/coordinate_set.h"

namespace lattice::ops {

// (M, 4) int32: the rows of `a`, then the rows of `b` absent from `a` (b order) — the outer join.
Array union_coords(const std::shared_ptr<CoordinateSet>& a, const std::shared_ptr<CoordinateSet>& b,
                   const RoutePolicy& policy = {});
// (M, 4) int32: the rows of `a` found in `b`, a order — the inner join.
Array intersection_coords(const std::shared_ptr<CoordinateSet>& a,
                          const std::shared_ptr<CoordinateSet>& b, const RoutePolicy& policy = {});
// (Q) int64: the row of `table` holding each query row (Q, 4) int32, or -1. Queries may repeat.
Array lookup_coords(const std::shared_ptr<CoordinateSet>& table, const Array& queries,
                    const RoutePolicy& policy = {});
// (Q) bool: lookup_coords(...) >= 0.
Array contains_coords(const std::shared_ptr<CoordinateSet>& table, const Array& queries,
                      const RoutePolicy& policy = {});

struct DownsampleOutput {
  Array coords;   // (M, 4) int32: unique (batch, floor_div(x, sx), ...), first-occurrence order
  Array inverse;  // (N) int64: input row -> output row
};
// coords (N, 4) int32 (repeats allowed); stride >= 1 per axis. Stride 1 deduplicates.
DownsampleOutput downsample_coords(const Array& coords, Int3 stride,
                                   const RoutePolicy& policy = {});

// Morton (Z-order) codes: x, y, z each offset by 2^20 and interleaved into 63 bits (x most
// significant), so every value must lie in [kMortonMin, kMortonMax] (ValueError naming the range
// otherwise: never a silent collision). The batch column is not part of the code.
inline constexpr std::int32_t kMortonMin = -(1 << 20);
inline constexpr std::int32_t kMortonMax = (1 << 20) - 1;
// coords (N, 3) (x, y, z) or (N, 4) (batch, x, y, z) int32 -> (N) int64 codes.
Array morton_codes(const Array& coords, const RoutePolicy& policy = {});
// (N) int64 permutation sorting rows by (batch, Morton code), stable (ties keep input order).
Array morton_order(const Array& coords, const RoutePolicy& policy = {});

// The route decision of a coordinate utility ("downsample_coords", "morton_codes", "morton_order").
Explanation explain_coords(std::string_view op, const Array& coords);
// The route decision of lookup_coords / contains_coords for `n_queries` query rows.
Explanation explain_lookup(std::string_view op, const CoordinateSet& table, std::int64_t n_queries);

}  // namespace lattice::ops
