// CPU coordinate-utility routes (downsample_coords, morton_codes, morton_order), called through
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

}  // namespace lattice::backend::cpu
