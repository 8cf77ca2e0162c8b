// Problem descriptions handed to the route layer: plain numbers and vocabulary, no tensors.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "lattice/core/device.h"
#include "lattice/core/dtype.h"
#include "lattice/core/vocab.h"

namespace lattice {

// One convolution pass over a built relation.
struct ConvProblem {
  std::string op = "conv3d";  // public op name: conv3d, subm_conv3d, conv_transpose3d, ...
  RelationKind relation = RelationKind::forward;
  ConvPass pass = ConvPass::forward;
  Dtype dtype = Dtype::f32;
  Device device;
  std::int64_t n_in = 0;
  std::int64_t n_out = 0;
  std::int64_t c_in = 0;
  std::int64_t c_out = 0;
  std::int64_t kernel_volume = 1;
  // The relation's edge count, or -1 when it has not been counted (a device relation counts its
  // edges on first use, one read-back; no conv route's admission depends on it).
  std::int64_t n_edges = 0;
  bool identity_relation = false;  // edges are exactly (i, i, 0) for every row: a plain matmul
  bool deterministic = true;       // bitwise-reproducible results required
  bool allow_tf32 = false;         // fp32 may use tf32 tensor cores
};
std::string to_string(const ConvProblem& problem);


// Packed affine int4/int8 weights (SEMANTICS.md "Packed affine quantization"): the forward pass
// of linear or a convolution whose weight is a QuantizedWeight. Inference only (no backward).
struct QuantizedProblem {
  std::string op = "linear";  // linear, conv3d, subm_conv3d, conv_transpose3d, ...
  bool has_relation = false;  // false for linear: every row times W, no relation
  RelationKind relation = RelationKind::submanifold;  // convolutions only
  Dtype dtype = Dtype::f32;        // activations
  Dtype scale_dtype = Dtype::f32;  // scales / biases of the packed weight
  Device device;
  int bits = 4;
  int group_size = 64;
  std::int64_t n_in = 0;
  std::int64_t n_out = 0;
  std::int64_t c_in = 0;
  std::int64_t c_out = 0;
  std::int64_t kernel_volume = 1;
  std::int64_t n_edges = 0;
  bool identity_relation = false;  // linear, or a 1x1x1 conv whose edges are (i, i, 0)
};
std::string to_string(const QuantizedProblem& problem);

// Point -> voxel quantization (sparse_quantize).
struct QuantizeProblem {
  std::string op = "sparse_quantize";
  Dtype dtype = Dtype::f32;  // point dtype
  Device device;
  std::int64_t n_points = 0;
};
std::string to_string(const QuantizeProblem& problem);

// Point <-> voxel conversion (voxelize, devoxelize, build_point_voxel_map).
enum class PointVoxelPass { forward, backward, build_map };
std::string_view to_string(PointVoxelPass pass);
struct PointVoxelProblem {
  std::string op = "voxelize";  // voxelize, devoxelize, build_point_voxel_map
  PointVoxelPass pass = PointVoxelPass::forward;
  Dtype dtype = Dtype::f32;  // feature dtype (point dtype for build_map)
  Device device;
  std::int64_t n_points = 0;
  std::int64_t n_voxels = 0;
  std::int64_t channels = 0;
  std::int64_t n_pairs = 0;  // (point, voxel) pairs: P for voxelize, P*8 slots for devoxelize
  std::string detail;        // reduction (voxelize) or mode (map ops), for the summary line
};
std::string to_string(const PointVoxelProblem& problem);

// Pooling (SEMANTICS.md "Pooling"): each output row reduces the input rows of its edges (PoolMode,
// in the core vocabulary).
enum class PoolPass { forward, input_grad };
std::string_view to_string(PoolPass pass);
// Where a pooling's edges come from: a relation kind (local pooling: forward / target;
// pool_transpose3d: transposed / transposed_target), the rows of each batch (global pooling) or
// the 8 coarse neighbours of each fine row (trilinear_upsample3d).
enum class PoolEdges { forward, target, transposed, transposed_target, batch, trilinear };
std::string_view to_string(PoolEdges edges);
struct PoolProblem {
  std::string op = "max_pool3d";  // public op name: pool3d, max_pool3d, global_avg_pool, ...
  PoolMode mode = PoolMode::max;
  PoolPass pass = PoolPass::forward;
  PoolEdges edges = PoolEdges::forward;
  Dtype dtype = Dtype::f32;
  Device device;
  std::int64_t n_in = 0;
  std::int64_t n_out = 0;
  std::int64_t channels = 0;
  std::int64_t n_edges = 0;
  KernelSpec spec;            // kernel geometry of relation edges (forward .. transposed_target)
  bool deterministic = true;  // bitwise-reproducible results required
};
std::string to_string(const PoolProblem& problem);

// Sparse algebra (SEMANTICS.md "Sparse algebra and coordinate utilities"): two coordinate sets
// aligned by value with a join (or query rows looked up in one set), then aligned feature rows
// combined elementwise.
enum class AlgebraPass { align, lookup, forward, backward };
std::string_view to_string(AlgebraPass pass);
struct AlgebraProblem {
  std::string op = "sparse_add";  // public op name: sparse_add, ..., union_coords, lookup_coords
  AlgebraPass pass = AlgebraPass::align;
  Join join = Join::outer;             // align
  AlgebraOp combine = AlgebraOp::add;  // forward / backward
  Dtype dtype = Dtype::i32;            // features (forward / backward); int32 coordinates otherwise
  Device device;
  std::int64_t n_lhs = 0;     // lhs rows (lookup: table rows)
  std::int64_t n_rhs = 0;     // rhs rows (lookup: query rows)
  std::int64_t n_out = 0;     // aligned rows (forward / backward)
  std::int64_t channels = 0;  // output feature columns (forward / backward)
  bool same_key = false;      // one coordinate identity on both sides: nothing aligned
};
std::string to_string(const AlgebraProblem& problem);

// Coordinate utilities computed from coordinate values alone.
enum class CoordsPass {
  downsample,
  morton_codes,
  morton_order,
  prune,
  crop,
  collate,
  dense,
  from_dense
};
std::string_view to_string(CoordsPass pass);
struct CoordsProblem {
  std::string op = "downsample_coords";  // downsample_coords, morton_codes, morton_order, prune,
                                         // crop, sparse_collate, dense, from_dense
  CoordsPass pass = CoordsPass::downsample;
  Device device;
  std::int64_t n_rows = 0;
};
std::string to_string(const CoordsProblem& problem);

// Coordinate indexing and relation building (family "relation"): the hash index over a coordinate
// set's rows (pass index) or a relation's support, edges and orderings (pass build).
enum class RelationPass { index, build };
std::string_view to_string(RelationPass pass);
struct RelationProblem {
  std::string op = "subm_conv3d";  // the op that needs the index / relation
  RelationPass pass = RelationPass::build;
  RelationKind relation = RelationKind::submanifold;  // pass build only
  Device device;
  std::int64_t n_rows = 0;          // rows hashed: the input set (build) or the set (index)
  std::int64_t kernel_volume = 1;   // pass build only
};
std::string to_string(const RelationProblem& problem);

// Edge lists pooling builds itself (family "pool_edges"): the rows of each batch (global
// pooling) or the weighted trilinear neighbours (trilinear_upsample3d).
enum class PoolEdgesPass { batch, trilinear };
std::string_view to_string(PoolEdgesPass pass);
struct PoolEdgesProblem {
  std::string op = "global_avg_pool";
  PoolEdgesPass pass = PoolEdgesPass::batch;
  Device device;
  std::int64_t n_rows = 0;  // input rows (batch) or fine rows (trilinear)
};
std::string to_string(const PoolEdgesProblem& problem);

// Index work of the point family (family "point_index"): the check and narrowing of batch ids
// (batch_ids) and the CSR of points per voxel (group).
enum class PointIndexPass { batch_ids, group };
std::string_view to_string(PointIndexPass pass);
struct PointIndexProblem {
  std::string op = "sparse_quantize";
  PointIndexPass pass = PointIndexPass::batch_ids;
  Device device;
  std::int64_t n_points = 0;
};
std::string to_string(const PointIndexProblem& problem);

// The packed-weight decoder (family "dequantize"): a whole QuantizedWeight decoded to
// (K, C_in, C_out) of `dtype` on the weight's device.
struct DequantizeProblem {
  std::string op = "dequantize_weight";
  Dtype dtype = Dtype::f32;
  Device device;
};
std::string to_string(const DequantizeProblem& problem);

// Batch normalisation over the rows of an (N, C) feature matrix, with an optional fused ReLU
// (family "batch_norm"): the forward pass (batch statistics in training, running statistics in
// eval) or the backward pass (dx, dgamma, dbeta).
enum class BatchNormPass { forward, backward };
std::string_view to_string(BatchNormPass pass);
struct BatchNormProblem {
  std::string op = "batch_norm";
  BatchNormPass pass = BatchNormPass::forward;
  bool training = true;
  bool relu = false;
  bool residual = false;  // forward: a residual added before the ReLU; backward: its gradient asked for
  Dtype dtype = Dtype::f32;  // features
  Device device;
  std::int64_t n_rows = 0;
  std::int64_t channels = 0;
};
std::string to_string(const BatchNormProblem& problem);

}  // namespace lattice
