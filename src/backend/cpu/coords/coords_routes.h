// CPU coordinate-utility routes (downsample_coords, morton_codes, morton_order, prune, crop,
// sparse_collate, dense, from_dense), called through
// the kernel table. Contract (DownsampleArgs, MortonArgs in backend/args.h): CPU memory,
// contiguous int32 coordinate rows; the semantic layer has validated shapes, strides and the
// Morton range. Admission is decided in src/route/coords_routes.cpp.
#pragma once

#include "backend/args.h"

namespace lattice::backend::cpu {

// reference.cpp: single-threaded; an open-addressing set over full rows for downsampling, a
// stable sort for the Morton order.
DownsampleResult coords_reference_downsample(const DownsampleArgs& args);
void coords_reference_morton(const MortonArgs& args);
// Row selection and layout of prune / crop / sparse_collate / dense / from_dense: single pass in
// input order.
Array coords_reference_select(const SelectArgs& args);
CollateResult coords_reference_collate(const std::vector<CollateSample>& samples);
void coords_reference_dense_index(const DenseIndexArgs& args);
NonzeroResult coords_reference_nonzero(const NonzeroArgs& args);

}  // namespace lattice::backend::cpu
