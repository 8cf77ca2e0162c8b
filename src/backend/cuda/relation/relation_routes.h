// Coordinate sets and relations built on a CUDA device: the functions behind
// backend::RelationKernels of the relation route cuda_hash (kernel_table.h). Plain C++ declarations (the kernel table is
// compiled by the host compiler); the kernels are in hash.cu.
//
// Every function runs on the current stream of the arrays' device and reads back to the host
// only counts (output sizes) and error checks. Results are deterministic: integer atomics are
// used only where the result does not depend on their order, compactions are scans.
#pragma once

#include <cstdint>

#include "backend/args.h"
#include "lattice/core/array.h"

namespace lattice::backend::cuda {

DeviceCoordTable device_build_table(const Array& coords);
DuplicateRow device_find_duplicate(const Array& coords, const DeviceCoordTable& table);
BatchHistogram device_batch_histogram(const Array& coords, std::int64_t n_batches);
DeviceSupportResult device_support(const DeviceSupportArgs& args);
DeviceEdges device_edges(const DeviceEdgeArgs& args);
Array device_row_masks(const Array& map);
DeviceInputGrouping device_input_grouping(const DeviceInputGroupingArgs& args);
DeviceEdges device_transpose(const DeviceTransposeArgs& args);
Array device_input_map(const DeviceTransposeArgs& args);
// Rows of an (n, K) map stably sorted by their offset mask (K <= 64; undefined otherwise).
Array device_row_order(const Array& map);

}  // namespace lattice::backend::cuda
