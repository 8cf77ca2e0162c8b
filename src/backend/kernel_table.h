// Kernel table: maps a route id to the backend functions that run it, and reports device
// capabilities. The semantic layer includes only this header (and args.h) from backend/.
#pragma once

#include <cstdint>

#include "backend/args.h"
#include "lattice/core/array.h"
#include "lattice/route/caps.h"
#include "lattice/route/route.h"

namespace lattice::backend {

using ConvFn = void (*)(const ConvArgs&);
struct ConvKernels {
  ConvFn forward = nullptr;
  ConvFn input_grad = nullptr;
  ConvFn weight_grad = nullptr;
};
// nullptr when the route has no kernels in this build.
const ConvKernels* find_conv_kernels(RouteId id);

using QuantizeFn = QuantizeResult (*)(const QuantizeArgs&);
QuantizeFn find_quantize_kernel(RouteId id);

using VoxelizeFn = void (*)(const VoxelizeArgs&);
using DevoxelizeFn = void (*)(const DevoxelizeArgs&);
using PointVoxelMapFn = PointVoxelMapResult (*)(const PointVoxelMapArgs&);
struct PointVoxelKernels {
  VoxelizeFn voxelize_forward = nullptr;
  VoxelizeFn voxelize_backward = nullptr;
  DevoxelizeFn devoxelize_forward = nullptr;
  DevoxelizeFn devoxelize_backward = nullptr;
  PointVoxelMapFn build_map = nullptr;
};
// nullptr when the route has no kernels in this build.
const PointVoxelKernels* find_point_voxel_kernels(RouteId id);

using PoolFn = void (*)(const PoolArgs&);
struct PoolKernels {
  PoolFn forward = nullptr;     // null when the route runs the input gradient only
  PoolFn input_grad = nullptr;
};
// nullptr when the route has no kernels in this build.
const PoolKernels* find_pool_kernels(RouteId id);

using AlignFn = AlignResult (*)(const AlignArgs&);
using LookupFn = void (*)(const LookupArgs&);
using CombineFn = void (*)(const CombineArgs&);
struct AlgebraKernels {
  AlignFn align = nullptr;
  LookupFn lookup = nullptr;
  CombineFn forward = nullptr;
  CombineFn backward = nullptr;
};
// nullptr when the route has no kernels in this build.
const AlgebraKernels* find_algebra_kernels(RouteId id);

using DownsampleFn = DownsampleResult (*)(const DownsampleArgs&);
using MortonFn = void (*)(const MortonArgs&);
struct CoordsKernels {
  DownsampleFn downsample = nullptr;
  MortonFn morton = nullptr;
  Array (*select)(const SelectArgs&) = nullptr;                      // prune, crop: kept rows
  CollateResult (*collate)(const std::vector<CollateSample>&) = nullptr;  // sparse_collate
  void (*dense_index)(const DenseIndexArgs&) = nullptr;              // dense
  NonzeroResult (*nonzero)(const NonzeroArgs&) = nullptr;            // from_dense
};
// nullptr when the route has no kernels in this build.
const CoordsKernels* find_coords_kernels(RouteId id);

// Capabilities of this process's devices: queried once and cached, except the CPU thread
// count, which is lattice's current setting (core/threads.h).
DeviceCaps device_caps();

}  // namespace lattice::backend
