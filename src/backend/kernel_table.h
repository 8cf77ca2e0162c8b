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
  ConvFn bias_grad = nullptr;  // dbias from dy on the route's device
};
// nullptr when the route has no kernels in this build.
const ConvKernels* find_conv_kernels(RouteId id);

// Packed affine weights (family "quantized"): dequant_reference fills `dequantize` (the semantic
// layer then runs the float conv route), fused_dequant_gemm fills `forward`; cuda_dequant_gemm
// fills `forward` and `dequantize` (the device decoder dequant_reference runs on CUDA data).
struct QuantizedKernels {
  void (*dequantize)(const DequantizeArgs&) = nullptr;
  void (*forward)(const QuantizedConvArgs&) = nullptr;
};
// nullptr when the route has no kernels in this build.
const QuantizedKernels* find_quantized_kernels(RouteId id);
// The packed-weight decoder (family "dequantize": reference, cuda): nullptr when the route has no
// kernel in this build.
using DequantizeFn = void (*)(const DequantizeArgs&);
DequantizeFn find_dequantize_kernel(RouteId id);

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

// Edge lists of global pooling and trilinear upsampling (family "pool_edges": reference, cuda).
struct PoolEdgeKernels {
  PoolEdgeList (*batch_edges)(const BatchEdgesArgs&) = nullptr;
  PoolEdgeList (*trilinear_edges)(const TrilinearEdgesArgs&) = nullptr;
};
// nullptr when the route has no kernels in this build.
const PoolEdgeKernels* find_pool_edge_kernels(RouteId id);

// Point-family index work (family "point_index": reference, cuda): batch id checks and the CSR
// of points per voxel.
struct PointIndexKernels {
  BatchIdsResult (*batch_ids)(const BatchIdsArgs&) = nullptr;
  PointGroupResult (*group)(const PointGroupArgs&) = nullptr;
};
// nullptr when the route has no kernels in this build.
const PointIndexKernels* find_point_index_kernels(RouteId id);

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

// The coordinate index and relation building (family "relation": cpu_hash, cuda_hash), same
// arguments on every device (backend/args.h "coordinate sets and relations on a device").
struct RelationKernels {
  DeviceCoordTable (*build_table)(const Array& coords) = nullptr;
  DuplicateRow (*find_duplicate)(const Array& coords, const DeviceCoordTable& table) = nullptr;
  BatchHistogram (*batch_histogram)(const Array& coords, std::int64_t n_batches) = nullptr;
  DeviceSupportResult (*support)(const DeviceSupportArgs&) = nullptr;
  DeviceEdges (*edges)(const DeviceEdgeArgs&) = nullptr;
  Array (*row_masks)(const Array& map) = nullptr;  // (n_out, K) int32 -> (n_out, ceil(K/64)) int64
  DeviceInputGrouping (*input_grouping)(const DeviceInputGroupingArgs&) = nullptr;
  DeviceEdges (*transpose)(const DeviceTransposeArgs&) = nullptr;
  // The input-side (R.n_in, K) map of R (args as for transpose): the transpose's gemm map alone.
  Array (*input_map)(const DeviceTransposeArgs&) = nullptr;
  // (n, K) int32 map -> (n) int32: the rows stably sorted by their offset mask (bit k set iff
  // map[row, k] >= 0, compared as an unsigned integer), so that consecutive rows share offsets;
  // undefined when K > 64 (no order: implicit-GEMM tiles then take rows in index order).
  Array (*row_order)(const Array& map) = nullptr;
};
// nullptr when the route has no kernels in this build.
const RelationKernels* find_relation_kernels(RouteId id);

// Capabilities of this process's devices: queried once and cached, except the CPU thread
// count, which is lattice's current setting (core/threads.h).
DeviceCaps device_caps();

}  // namespace lattice::backend
