// CPU point <-> voxel routes: one function per (route, pass), called through the kernel table.
//
// Contract shared by all of them (backend/args.h): CPU memory, contiguous row-major; features
// f16, bf16, f32 or f64, accumulated in f32 (f64 for f64) and rounded to the storage dtype once
// per output element. Every output element is computed by one loop in a fixed order, so the
// routes are deterministic and bitwise identical to each other for any thread count:
//   voxelize forward   out[v]    = reduction over the points of v in ascending point order,
//   voxelize backward  dfeats[p] = a gather from dy[inverse[p]] (no scatter),
//   devoxelize forward out[p]    = sum over corners k = 0..7 of weight * voxel_feats,
//   devoxelize backward dvoxel[v] = sum over the map entries of v in ascending (p, k) order.
// Admission is decided in src/route/point_voxel_routes.cpp; each route's file opens with a
// `Constraints:` comment stating the same conditions.
#pragma once

#include "backend/args.h"

namespace lattice::backend::cpu {

// reference.cpp: scalar single-threaded loops (scatter in point order); the oracle for the others.
void voxelize_reference_forward(const VoxelizeArgs& args);
void voxelize_reference_backward(const VoxelizeArgs& args);
void devoxelize_reference_forward(const DevoxelizeArgs& args);
void devoxelize_reference_backward(const DevoxelizeArgs& args);
PointVoxelMapResult point_voxel_map_reference(const PointVoxelMapArgs& args);

// parallel.cpp: OpenMP over voxels (segment reductions over the CSR) or points (gathers).
void voxelize_parallel_forward(const VoxelizeArgs& args);
void voxelize_parallel_backward(const VoxelizeArgs& args);
void devoxelize_parallel_forward(const DevoxelizeArgs& args);
void devoxelize_parallel_backward(const DevoxelizeArgs& args);
PointVoxelMapResult point_voxel_map_parallel(const PointVoxelMapArgs& args);

// index.cpp (family point_index, route reference): batch id checks and the CSR of points per
// voxel for CPU data.
BatchIdsResult point_index_reference_batch_ids(const BatchIdsArgs& args);
PointGroupResult point_index_reference_group(const PointGroupArgs& args);

}  // namespace lattice::backend::cpu
