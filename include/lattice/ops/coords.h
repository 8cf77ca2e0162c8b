// Coordinate utilities (SEMANTICS.md "Sparse algebra and coordinate utilities"): set operations
// and lookups by coordinate value (through the algebra routes), downsampling and Morton codes
// (through the coords routes). Coordinates are (N, 4) int32 rows (batch, x, y, z) on the CPU.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

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

// Row selection and layout of prune, crop, sparse_collate, dense and from_dense (the features
// are moved by the caller, e.g. torch index_select on the returned rows).
// prune: (K) int64 ascending rows of coords (N, 4) where mask (N) bool/uint8 is non-zero.
Array prune_rows(const Array& coords, const Array& mask, const RoutePolicy& policy = {});
// crop: (K) int64 ascending rows with lo <= (x, y, z) < hi (hi >= lo per axis).
Array crop_rows(const Array& coords, Int3 lo, Int3 hi, const RoutePolicy& policy = {});
struct CollateOutput {
  Array coords;                      // (sum N_i, 4) int32: (i, x, y, z)
  std::vector<std::int64_t> counts;  // N_i
};
// sparse_collate: samples' coordinates (N_i, 3) or (N_i, 4) (batch column ignored), at least one.
CollateOutput collate_coords(const std::vector<Array>& samples, const RoutePolicy& policy = {});
// dense: (N) int64 flat cell of each row in the (B, X, Y, Z) grid with cell (0, 0, 0) at origin;
// every row must have batch >= 0 and lie in [origin, origin + size).
Array dense_index(const Array& coords, Int3 origin, std::array<std::int64_t, 3> size,
                  const RoutePolicy& policy = {});
struct NonzeroOutput {
  Array coords;                      // (K, 4) int32 (b, cell + origin), lexicographic
  Array index;                       // (K) int64 flat cell
  std::vector<std::int64_t> counts;  // rows per batch (B entries)
};
// from_dense: the non-zero sites of a (B, X, Y, Z) bool/uint8 mask; origin + size within int32.
NonzeroOutput nonzero_sites(const Array& site, Int3 origin, const RoutePolicy& policy = {});

// The route decision of a coordinate utility ("downsample_coords", "morton_codes", "morton_order",
// "prune", "crop", "sparse_collate", "dense", "from_dense").
Explanation explain_coords(std::string_view op, const Array& coords);
// The same for `n_rows` CPU rows (sparse_collate: all samples; from_dense: the grid's cells).
Explanation explain_coords(std::string_view op, std::int64_t n_rows, Device device = {});
// The route decision of lookup_coords / contains_coords for `n_queries` query rows.
Explanation explain_lookup(std::string_view op, const CoordinateSet& table, std::int64_t n_queries);

}  // namespace lattice::ops
