// CPU relation route (cpu_hash): the coordinate index and the relations built from it, called
// through the kernel table with the same arguments as the CUDA route (backend/args.h,
// "coordinate sets and relations on a device"). Contract: CPU memory, contiguous (N, 4) int32
// rows; the tensor layer has validated the kernel geometry and the row count. Admission is
// decided in src/route/relation_routes.cpp.
#pragma once

#include "backend/args.h"

namespace lattice::backend::cpu {

// hash.cpp: sequential insertion in row order (the first repeated row is recorded in the table
// and returned by find_duplicate); supports in first-occurrence order; the edge lists and
// orderings in parallel over fixed ranges (bitwise-identical for any thread count).
DeviceCoordTable relation_cpu_hash_build_table(const Array& coords);
DuplicateRow relation_cpu_hash_find_duplicate(const Array& coords, const DeviceCoordTable& table);
BatchHistogram relation_cpu_hash_batch_histogram(const Array& coords, std::int64_t n_batches);
DeviceSupportResult relation_cpu_hash_support(const DeviceSupportArgs& args);
DeviceEdges relation_cpu_hash_edges(const DeviceEdgeArgs& args);
Array relation_cpu_hash_row_masks(const Array& map);
DeviceInputGrouping relation_cpu_hash_input_grouping(const DeviceInputGroupingArgs& args);
// The transposed relation: R's edges scattered into the (n_out_T = R.n_in, K) map, then compacted
// exactly as relation_cpu_hash_edges compacts its map (so it equals a hashed build bitwise).
DeviceEdges relation_cpu_hash_transpose(const DeviceTransposeArgs& args);
Array relation_cpu_hash_input_map(const DeviceTransposeArgs& args);
// Rows of an (n, K) map stably sorted by their offset mask (K <= 64; undefined otherwise).
Array relation_cpu_hash_row_order(const Array& map);

}  // namespace lattice::backend::cpu
