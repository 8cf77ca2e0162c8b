// The kernel interface of every op family: one struct of entry points per family, and the macro
// with which a route's kernel file registers its struct (LATTICE_ROUTE_KERNELS, below).
//
// The semantic layer reaches these structs through kernel_table.h (find_<family>_kernels); the
// backends include this header (and args.h) only, so it names no route header: a kernel file
// registers under its route's RouteId spelling (conv_implicit_gemm_sm80), and the kernel table,
// which sees both sides, turns the spelling into RouteId::conv_implicit_gemm_sm80 (a misspelt
// route fails to compile there).
//
// Contract of every entry point (backend/args.h): arrays on the args' device, contiguous
// row-major; each pass fully overwrites its outputs; float outputs accumulate f16/bf16 in f32 (f64
// in f64) and are rounded to the storage dtype once per element, at the end. CUDA entry points run
// on the current stream of the args' device. Admission (which problems a route accepts) is
// decided by the route's row in src/route/<family>_routes.cpp; each kernel file opens with the
// matching `Constraints:` paragraph (limits, determinism).
#pragma once

#include <string_view>
#include <vector>

#include "backend/args.h"
#include "lattice/core/array.h"

namespace lattice::backend {

// Convolution (family "conv"): weight in the canonical (K, C_in, C_out) layout; the inputs each
// pass reads are listed in args.h (ConvArgs).
using ConvFn = void (*)(const ConvArgs&);
struct ConvKernels {
  static constexpr std::string_view family = "conv";
  ConvFn forward = nullptr;
  ConvFn input_grad = nullptr;
  ConvFn weight_grad = nullptr;
  ConvFn bias_grad = nullptr;  // dbias from dy on the route's device
};

// Packed affine weights (family "quantized"): dequant_reference fills `dequantize` (the semantic
// layer then runs the float conv route), fused_dequant_gemm fills `forward`; cuda_dequant_gemm
// fills `forward` and `dequantize` (the device decoder dequant_reference runs on CUDA data).
struct QuantizedKernels {
  static constexpr std::string_view family = "quantized";
  void (*dequantize)(const DequantizeArgs&) = nullptr;
  void (*forward)(const QuantizedConvArgs&) = nullptr;
};

// The packed-weight decoder (family "dequantize"): the whole weight to (K, C_in, C_out).
using DequantizeFn = void (*)(const DequantizeArgs&);
struct DequantizeKernels {
  static constexpr std::string_view family = "dequantize";
  DequantizeFn dequantize = nullptr;
};

// sparse_quantize (family "quantize"): points -> unique voxels and the inverse map.
using QuantizeFn = QuantizeResult (*)(const QuantizeArgs&);
struct QuantizeKernels {
  static constexpr std::string_view family = "quantize";
  QuantizeFn quantize = nullptr;
};

// Point <-> voxel (family "point_voxel"). Every output element is computed by one loop in a fixed
// order, so the routes agree bitwise for any thread count:
//   voxelize forward    out[v]    = reduction over the points of v in ascending point order,
//   voxelize backward   dfeats[p] = a gather from dy[inverse[p]] (no scatter),
//   devoxelize forward  out[p]    = sum over corners k = 0..7 of weight * voxel_feats,
//   devoxelize backward dvoxel[v] = sum over the map entries of v in ascending (p, k) order.
using VoxelizeFn = void (*)(const VoxelizeArgs&);
using DevoxelizeFn = void (*)(const DevoxelizeArgs&);
using PointVoxelMapFn = PointVoxelMapResult (*)(const PointVoxelMapArgs&);
struct PointVoxelKernels {
  static constexpr std::string_view family = "point_voxel";
  VoxelizeFn voxelize_forward = nullptr;
  VoxelizeFn voxelize_backward = nullptr;
  DevoxelizeFn devoxelize_forward = nullptr;
  DevoxelizeFn devoxelize_backward = nullptr;
  PointVoxelMapFn build_map = nullptr;
};

// Pooling (family "pool"): the summation orders are in backend/cpu/pool/pool_routes.h, identical
// in every route.
using PoolFn = void (*)(const PoolArgs&);
struct PoolKernels {
  static constexpr std::string_view family = "pool";
  PoolFn forward = nullptr;     // null when the route runs the input gradient only
  PoolFn input_grad = nullptr;
};

// Edge lists of global pooling and trilinear upsampling (family "pool_edges").
struct PoolEdgeKernels {
  static constexpr std::string_view family = "pool_edges";
  PoolEdgeList (*batch_edges)(const BatchEdgesArgs&) = nullptr;
  PoolEdgeList (*trilinear_edges)(const TrilinearEdgesArgs&) = nullptr;
};

// Point-family index work (family "point_index"): batch id checks and the CSR of points per
// voxel.
struct PointIndexKernels {
  static constexpr std::string_view family = "point_index";
  BatchIdsResult (*batch_ids)(const BatchIdsArgs&) = nullptr;
  PointGroupResult (*group)(const PointGroupArgs&) = nullptr;
};

// Sparse algebra (family "algebra"): alignment of two coordinate sets by value, lookups of query
// rows, the elementwise combine of aligned rows. Coordinate rows (batch, x, y, z) int32, unique
// within a set; row maps int64 with -1 for "absent, use the fill".
using AlignFn = AlignResult (*)(const AlignArgs&);
using LookupFn = void (*)(const LookupArgs&);
using CombineFn = void (*)(const CombineArgs&);
struct AlgebraKernels {
  static constexpr std::string_view family = "algebra";
  AlignFn align = nullptr;
  LookupFn lookup = nullptr;
  CombineFn forward = nullptr;
  CombineFn backward = nullptr;
};

// Coordinate utilities (family "coords"): downsample_coords, morton_codes / morton_order, prune,
// crop, sparse_collate, dense, from_dense; the semantic layer has validated shapes, strides and
// the Morton range.
using DownsampleFn = DownsampleResult (*)(const DownsampleArgs&);
using MortonFn = void (*)(const MortonArgs&);
struct CoordsKernels {
  static constexpr std::string_view family = "coords";
  DownsampleFn downsample = nullptr;
  MortonFn morton = nullptr;
  Array (*select)(const SelectArgs&) = nullptr;                      // prune, crop: kept rows
  CollateResult (*collate)(const std::vector<CollateSample>&) = nullptr;  // sparse_collate
  void (*dense_index)(const DenseIndexArgs&) = nullptr;              // dense
  NonzeroResult (*nonzero)(const NonzeroArgs&) = nullptr;            // from_dense
};

// The coordinate index and relation building (family "relation"), same arguments on every device
// (backend/args.h "coordinate sets and relations on a device"); (N, 4) int32 rows, the tensor
// layer has validated the kernel geometry and the row count.
struct RelationKernels {
  static constexpr std::string_view family = "relation";
  DeviceCoordTable (*build_table)(const Array& coords) = nullptr;
  DuplicateRow (*find_duplicate)(const Array& coords, const DeviceCoordTable& table) = nullptr;
  BatchHistogram (*batch_histogram)(const Array& coords, std::int64_t n_batches) = nullptr;
  DeviceSupportResult (*support)(const DeviceSupportArgs&) = nullptr;
  // The relation's (n_out, K) map (see DeviceEdges); every other view derives from a map:
  DeviceEdges (*edges)(const DeviceEdgeArgs&) = nullptr;
  // Edges in a map (entries >= 0); on a device, one read-back.
  std::int64_t (*count_edges)(const Array& map) = nullptr;
  // (n, K) map -> (n + 1) int64 CSR pointer over its rows (no read-back).
  Array (*row_ptr)(const Array& map) = nullptr;
  // The output-major edge list of a map with n_edges entries and its row_ptr.
  DeviceEdgeList (*edge_list)(const Array& map, const Array& row_ptr, std::int64_t n_edges) = nullptr;
  // The per-offset grouping of a map with n_edges entries (-1: not known; see DeviceOffsetGrouping).
  DeviceOffsetGrouping (*per_offset)(const Array& map, std::int64_t n_edges) = nullptr;
  Array (*row_masks)(const Array& map) = nullptr;  // (n_out, K) int32 -> (n_out, ceil(K/64)) int64
  DeviceInputGrouping (*input_grouping)(const DeviceInputGroupingArgs&) = nullptr;
  // The input-side (n_in, K) map of a relation from its (n_out, K) map: inv[i, k] = o where
  // map[o, k] == i, else -1 (no conflicts: each (input row, offset) holds at most one edge). It is
  // also the map of the relation's transpose (bitwise what hashing the transposed rule gives).
  Array (*input_map)(const Array& map, std::int64_t n_in) = nullptr;
  // (n, K) map -> (n, K) map with its offsets reversed: out[r, k] = map[r, K - 1 - k]. A
  // submanifold relation's input-side map is its map mirrored (its offsets are centred, so offset
  // K - 1 - k is minus offset k, and its input rows are its output rows): no scatter, no fill.
  Array (*mirror_map)(const Array& map) = nullptr;
  // (n, K) int32 map -> (n) int32: the rows stably sorted by their offset mask (bit k set iff
  // map[row, k] >= 0, compared as an unsigned integer), so that consecutive rows share offsets;
  // undefined when K > 64 (no order: implicit-GEMM tiles then take rows in index order).
  Array (*row_order)(const Array& map) = nullptr;
};

// Batch normalisation (+ fused ReLU) of an (N, C) feature matrix (family "batch_norm"); the
// semantic layer has validated shapes, dtypes and devices (args.h BatchNormArgs).
using BatchNormFn = void (*)(const BatchNormArgs&);
struct BatchNormKernels {
  static constexpr std::string_view family = "batch_norm";
  BatchNormFn forward = nullptr;
  BatchNormFn backward = nullptr;
};

}  // namespace lattice::backend

// LATTICE_ROUTE_KERNELS(Kernels, route, {.field = device::function, ...});
//
// Registers the entry points of one route, in its kernel file, at namespace scope after the
// functions (outside any namespace): `Kernels` is the family's struct above, `route` the
// route's RouteId enumerator spelling, the braces a designated initializer of the struct whose
// functions are named with their backend namespace (cpu:: or cuda::); omitted fields stay null.
//
//   LATTICE_ROUTE_KERNELS(ConvKernels, conv_reference,
//                         {.forward = cpu::conv_reference_forward, ...});
//
// It defines the constant-initialized object lattice::backend::registered::<route> (no static
// initializer runs, so nothing depends on initialization order). The build collects the lines
// that start with `LATTICE_ROUTE_KERNELS(` from the backend sources it compiles
// (cmake/kernel_registry.cmake: the first two arguments must be on that line) into
// <build>/generated/backend/kernel_registry.inc, from which kernel_table.cpp's lookups name
// every registered object; that reference is what links a kernel file into a program, from the
// static archives and from an installed liblattice.a alike (a self-registering static
// initializer would be dropped by the linker in a file nothing references).
#define LATTICE_ROUTE_KERNELS(Kernels, route, ...)                  \
  namespace lattice::backend::registered {                         \
  extern const ::lattice::backend::Kernels route;                  \
  constinit const ::lattice::backend::Kernels route = __VA_ARGS__; \
  }                                                                \
  static_assert(true, "LATTICE_ROUTE_KERNELS(...) ends with a semicolon")
