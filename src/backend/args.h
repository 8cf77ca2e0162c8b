// Typed, non-owning views handed from the semantic layer to kernels. Pointers refer to memory
// on the problem's device; every array is contiguous row-major.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/common/coord_hash.h"
#include "lattice/core/array.h"
#include "lattice/core/dtype.h"
#include "lattice/core/vocab.h"

namespace lattice::backend {

// The views of one relation that kernels read (built by src/tensor/relation.cpp).
// Edges (i, o, k) with i < n_in, o < n_out, k < kernel_volume; at most one edge per (o, k).
// Filled per route and pass with exactly what that route reads (conv_relation_reads,
// src/route/conv_routes.cpp; ops::relation_view): every field it does not read is null, and
// n_edges is 0 when the route does not read the count (the implicit-GEMM forward).
struct RelationView {
  std::int64_t n_in = 0;
  std::int64_t n_out = 0;
  std::int64_t kernel_volume = 1;
  std::int64_t n_edges = 0;
  // The edge count when the relation knows it without a read-back (geometry hints, or counted
  // already), else -1; filled for every pass. A hint (tile shapes), never required: passes that
  // need the count read n_edges.
  std::int64_t known_edges = -1;
  // Output-major edge list, sorted by (o, k): in_idx[e], out_idx[e], k_idx[e] (int32, E).
  const std::int32_t* in_idx = nullptr;
  const std::int32_t* out_idx = nullptr;
  const std::int32_t* k_idx = nullptr;
  // CSR over the output-major list: edges of output o are [out_ptr[o], out_ptr[o+1]) (int64, n_out+1).
  const std::int64_t* out_ptr = nullptr;
  // Per-offset grouping, sorted by (k, o): edges of offset k are [k_ptr[k], k_ptr[k+1])
  // (int64, K+1), with their input and output rows in k_in / k_out (int32, E).
  const std::int64_t* k_ptr = nullptr;
  const std::int32_t* k_in = nullptr;
  const std::int32_t* k_out = nullptr;
  bool identity = false;  // edges are exactly (i, i, 0) for every row
  // Input-side views, filled for the input-gradient pass only (null otherwise): edges per input
  // row as a CSR pointer (int64, n_in+1), and the per-offset grouping (same k_ptr) with each
  // offset's edges sorted by input row (kt_in / kt_out, int32 E).
  const std::int64_t* in_ptr = nullptr;
  const std::int32_t* kt_in = nullptr;
  const std::int32_t* kt_out = nullptr;
  // The N_out x K implicit-GEMM map (int32 (n_out, K), input row or -1), or null: CUDA routes
  // that read it build it on the device when null.
  const std::int32_t* gemm_map = nullptr;
  // The input-side (n_in, K) map (output row reached from input i through offset k, or -1), for
  // the input-gradient pass of implicit-GEMM routes; null: the route builds it per call.
  const std::int32_t* input_gemm_map = nullptr;
  // The order tiles take the rows of gemm_map / input_gemm_map in (int32 (n_out) / (n_in), rows
  // sorted by offset mask), or null: rows in index order. Results do not depend on it beyond the
  // sign of exact zeros (a row's sum visits its own offsets in ascending order either way).
  const std::int32_t* gemm_order = nullptr;
  const std::int32_t* input_gemm_order = nullptr;
  // k_ptr on the host (K + 1 int64), for host loops over offsets (per-offset GEMM launches):
  // read back from the device once per relation, on first request, and kept with the relation.
  // Null when the caller attached none (routes then read k_ptr back themselves).
  const std::int64_t* (*host_k_ptr_of)(const void* owner) = nullptr;
  const void* host_k_ptr_owner = nullptr;
  const std::int64_t* host_k_ptr() const { return host_k_ptr_of ? host_k_ptr_of(host_k_ptr_owner) : nullptr; }
};

// One convolution pass. Weight is always the canonical (K, C_in, C_out) layout, same dtype as
// the features. Outputs are fully overwritten by the kernel (no need to pre-zero).
struct ConvArgs {
  Dtype dtype = Dtype::f32;
  RelationView rel;
  std::int64_t c_in = 0;
  std::int64_t c_out = 0;
  const void* x = nullptr;     // (n_in, C_in)        forward, weight_grad
  const void* w = nullptr;     // (K, C_in, C_out)    forward, input_grad
  const void* bias = nullptr;  // (C_out) or null     forward
  void* y = nullptr;           // (n_out, C_out)      forward output
  const void* dy = nullptr;    // (n_out, C_out)      input_grad, weight_grad
  void* dx = nullptr;          // (n_in, C_in)        input_grad output
  void* dw = nullptr;          // (K, C_in, C_out)    weight_grad output
  void* dbias = nullptr;       // (C_out)             bias_grad output (column sums of dy)
  Device device = Device::cpu();  // where every array above lives (CUDA: the stream's device)
  bool allow_tf32 = false;        // f32 may use tf32 tensor cores (ConvProblem::allow_tf32)
};

// ---- packed affine int4/int8 weights (SEMANTICS.md "Packed affine quantization") -------------
// A packed weight: codes q (bits each, 32/bits per uint32 word, LSB first) with one scale and bias
// per group of group_size consecutive input channels; value = scale*q + bias computed in f32,
// rounded to the scale dtype (the weight dequantize_weight() returns) and then to the activation
// dtype. Storage (C_in_st = C_in zero-padded to a multiple of group_size, W = C_in_st*bits/32):
//   by_output == false (convolutions): packed (K, W, C_out), scales/biases (K, C_in_st/G, C_out)
//   by_output == true  (linear, K = 1): packed (C_out, W),   scales/biases (C_out, C_in_st/G)
struct QuantizedWeightArgs {
  const std::uint32_t* packed = nullptr;
  const void* scales = nullptr;
  const void* biases = nullptr;
  Dtype scale_dtype = Dtype::f32;  // f16, bf16 or f32
  int bits = 4;                    // 4 or 8
  int group_size = 64;             // 32, 64 or 128
  bool by_output = false;
  std::int64_t kernel_volume = 1;
  std::int64_t c_in = 0;          // logical input channels (<= c_in_storage)
  std::int64_t c_in_storage = 0;  // C_in_st
  std::int64_t c_out = 0;
};
// dequant_reference: the whole weight, out (K, C_in, C_out) of `dtype` (logical C_in rows).
struct DequantizeArgs {
  QuantizedWeightArgs w;
  Dtype dtype = Dtype::f32;
  void* out = nullptr;
  Device device = Device::cpu();  // where the weight arrays and out live
};
// A fused forward: y (n_out, C_out) = bias + sum over edges (i, o, k) of x[i] @ W[k], with rel
// identity (K == 1, n_in == n_out, no edge lists read) for linear and 1x1x1 identity relations,
// else the per-offset grouping (k_ptr, k_in, k_out) and out_ptr. x, bias, y of `dtype`.
struct QuantizedConvArgs {
  Dtype dtype = Dtype::f32;
  RelationView rel;
  QuantizedWeightArgs w;
  const void* x = nullptr;     // (n_in, C_in)
  const void* bias = nullptr;  // (C_out) or null
  void* y = nullptr;           // (n_out, C_out) output, fully overwritten
  Device device = Device::cpu();  // where every array above lives (CUDA: the stream's device)
};

// Point quantization: coords = floor((p - origin) / voxel) with the batch id, unique rows in
// first-occurrence order.
struct QuantizeArgs {
  Dtype dtype = Dtype::f32;     // point dtype (f32 or f64)
  std::int64_t n_points = 0;
  const void* points = nullptr;         // (P, 3)
  const std::int32_t* batch = nullptr;  // (P) or null (all batch 0)
  double voxel_size[3] = {1, 1, 1};
  double origin[3] = {0, 0, 0};
  bool drop_invalid = false;  // skip NaN/inf points (and report them in `kept`) instead of failing
  Device device{};            // where points / batch live (outputs are allocated there)
};

// What a quantize route returns (outputs are sized by the data, so the route allocates them).
struct QuantizeResult {
  Array coords;                      // (M, 4) int32, unique, first-occurrence order
  Array inverse;                     // (P) int64, point -> voxel row
  Array counts;                      // (M) int64, points per voxel
  std::int64_t first_invalid = -1;   // first point with NaN/inf (nothing else filled when >= 0)
  std::int64_t first_overflow = -1;  // first point whose voxel index leaves int32
  Array kept;  // drop_invalid only: (P) bool, false for dropped points; inverse then has one
               // entry per kept point (as if the dropped rows were never passed)
};

// ---- point <-> voxel (SEMANTICS.md "Point <-> voxel") ----------------------------------------

// voxelize: per-voxel reduction of point features over a CSR of points per voxel (the points
// of voxel v are point_idx[voxel_ptr[v] .. voxel_ptr[v+1]), ascending). Every voxel has >= 1
// point. Forward writes `out` (and `argmax` for max); backward reads `dy` (and `argmax`) and
// writes `dfeats`. Outputs are fully overwritten.
struct VoxelizeArgs {
  Dtype dtype = Dtype::f32;  // feature dtype (f16, bf16, f32, f64)
  PointReduction reduction = PointReduction::mean;
  std::int64_t n_points = 0;
  std::int64_t n_voxels = 0;
  std::int64_t channels = 0;
  const std::int64_t* inverse = nullptr;    // (P) point -> voxel row
  const std::int64_t* counts = nullptr;     // (M) points per voxel
  const std::int64_t* voxel_ptr = nullptr;  // (M+1)
  const std::int64_t* point_idx = nullptr;  // (P)
  const void* feats = nullptr;              // (P, C)  forward
  void* out = nullptr;                      // (M, C)  forward output
  std::int64_t* argmax = nullptr;           // (M, C)  max: first point holding the maximum
                                            //         (forward output, backward input)
  const void* dy = nullptr;                 // (M, C)  backward
  void* dfeats = nullptr;                   // (P, C)  backward output
  Device device{};                          // where every pointer lives
};

// devoxelize: out[p] = sum_k weights[p, k] * voxel_feats[indices[p, k]] over k with index >= 0
// (k ascending); backward dvoxel[v] = sum over the map entries of v (voxel-major CSR, entries
// p*width + k ascending) of weights * dy[p]. Outputs are fully overwritten.
struct DevoxelizeArgs {
  Dtype dtype = Dtype::f32;         // feature dtype (f16, bf16, f32, f64)
  Dtype weight_dtype = Dtype::f32;  // f32 or f64
  std::int64_t n_points = 0;
  std::int64_t n_voxels = 0;
  std::int64_t channels = 0;
  std::int64_t width = 8;                   // columns of indices / weights
  const std::int64_t* indices = nullptr;    // (P, width), -1 = no voxel
  const void* weights = nullptr;            // (P, width)
  const std::int64_t* voxel_ptr = nullptr;  // (M+1)
  const std::int64_t* entries = nullptr;    // (E)
  const void* voxel_feats = nullptr;        // (M, C)  forward
  void* out = nullptr;                      // (P, C)  forward output
  const void* dy = nullptr;                 // (P, C)  backward
  void* dvoxel = nullptr;                   // (M, C)  backward output
  Device device{};                          // where every pointer lives
};

// Row of voxel (b, x, y, z) in the voxel set, or -1: a view of the set's coordinate index
// (thread-safe, read-only).
struct VoxelLookup {
  const void* context = nullptr;
  std::int64_t (*find)(const void* context, std::int32_t b, std::int32_t x, std::int32_t y,
                       std::int32_t z) = nullptr;
};

// build_point_voxel_map: per point the voxel containing it (nearest) or the 8 voxel centres
// around it (trilinear), with weights; plus the voxel-major CSR for devoxelize's backward.
struct PointVoxelMapArgs {
  Dtype dtype = Dtype::f32;  // point dtype (f32 or f64); the weights come out in it
  std::int64_t n_points = 0;
  std::int64_t n_voxels = 0;
  const void* points = nullptr;         // (P, 3)
  const std::int32_t* batch = nullptr;  // (P) or null (all batch 0)
  double voxel_size[3] = {1, 1, 1};     // at stride 1; the voxels' physical size is voxel_size*stride
  std::int32_t stride[3] = {1, 1, 1};   // the voxel tensor's stride
  double origin[3] = {0, 0, 0};
  PointVoxelMode mode = PointVoxelMode::nearest;
  bool normalize = true;
  VoxelLookup lookup;
  Device device{};                        // where points / batch live (outputs are allocated there)
  const std::int32_t* voxel_coords = nullptr;  // (M, 4) the voxel rows: device routes look them
                                               // up in a device table instead of `lookup`:
  const std::int32_t* voxel_slots = nullptr;   // the cached DeviceCoordTable of the voxels
  std::uint64_t voxel_mask = 0;                // (null: the route builds one and checks rows)
};

struct PointVoxelMapResult {
  Array indices;    // (P, 8) int64, -1 = missing
  Array weights;    // (P, 8) point dtype
  Array voxel_ptr;  // (M+1) int64
  Array entries;    // (E) int64, p*8 + k, ascending within each voxel
  std::int64_t first_invalid = -1;  // first point with NaN/inf (nothing else filled when >= 0)
  // Device routes only: the first voxel row repeating an earlier one (and that row), -1 when the
  // voxel rows are unique (nothing else filled when >= 0).
  std::int64_t duplicate_row = -1;
  std::int64_t duplicate_first = -1;
};

// ---- pooling (SEMANTICS.md "Pooling") ----------------------------------------------------------

// One pooling pass over an output-major edge list: the edges of output row o are
// [out_ptr[o], out_ptr[o+1]) with input rows in_idx[e] (no input row twice within one output
// row; rows may have no edge). Modes: sum, avg (sum / edges of the row; 0 for a row without
// edges), max (per channel, ties to the smallest input row; 0 and argmax -1 for a row without
// edges), weighted (sum of weights[e] * x). Outputs are fully overwritten.
struct PoolArgs {
  Dtype dtype = Dtype::f32;  // feature dtype (f16, bf16, f32, f64)
  PoolMode mode = PoolMode::sum;
  std::int64_t n_in = 0;
  std::int64_t n_out = 0;
  std::int64_t channels = 0;
  std::int64_t n_edges = 0;
  const std::int64_t* out_ptr = nullptr;  // (n_out + 1)
  const std::int32_t* in_idx = nullptr;   // (E)
  const double* weights = nullptr;        // (E), mode weighted only
  const void* x = nullptr;                // (n_in, C)   forward
  void* y = nullptr;                      // (n_out, C)  forward output
  std::int32_t* argmax = nullptr;         // (n_out, C)  mode max: winning input row or -1
                                          //             (forward output, input_grad input)
  const void* dy = nullptr;               // (n_out, C)  input_grad
  void* dx = nullptr;                     // (n_in, C)   input_grad output
  Device device{};                        // where every pointer lives
};

// ---- sparse algebra (SEMANTICS.md "Sparse algebra and coordinate utilities") -------------------

// A coordinate -> row lookup into an index the tensor layer built (CoordIndex::find): a route
// probes an existing index without depending on the tensor layer. find() is const and thread-safe.
struct CoordFinder {
  const void* index = nullptr;
  std::int64_t (*find)(const void* index, const geometry::Coord4& c) = nullptr;
  std::int64_t operator()(const geometry::Coord4& c) const { return find(index, c); }
};

// Alignment of two sets of unique coordinate rows by value. Output rows: inner = lhs rows found
// in rhs (lhs order); left = lhs rows; right = rhs rows; outer = lhs rows, then the rhs rows
// absent from lhs (rhs order).
struct AlignArgs {
  Join join = Join::outer;
  std::int64_t n_lhs = 0;
  std::int64_t n_rhs = 0;
  const std::int32_t* lhs = nullptr;  // (n_lhs, 4) (batch, x, y, z)
  const std::int32_t* rhs = nullptr;  // (n_rhs, 4)
  CoordFinder lhs_index;              // over lhs (for routes that probe an index)
  CoordFinder rhs_index;              // over rhs
  Device device{};                    // where lhs / rhs live (device routes allocate there)
  std::string_view op;                // names the caller in errors raised by device routes
};
// What an align route returns (sized by the data, so the route allocates).
struct AlignResult {
  Array lhs_rows;  // (M) int64: lhs row of output row m, -1 when lhs lacks that coordinate
  Array rhs_rows;  // (M) int64: likewise for rhs
  Array coords;    // (M, 4) int32 output coordinates
};

// Row of each query in a table of unique rows, or -1.
struct LookupArgs {
  std::int64_t n_table = 0;
  std::int64_t n_queries = 0;
  const std::int32_t* table = nullptr;    // (n_table, 4)
  const std::int32_t* queries = nullptr;  // (n_queries, 4), repeats allowed
  CoordFinder index;                      // over table
  std::int64_t* rows = nullptr;           // (n_queries) output
  Device device{};                        // where every pointer lives
  std::string_view op;                    // names the caller in errors raised by device routes
};

// Elementwise combine of aligned rows. Output row m reads a = lhs[lhs_rows[m]] (the fill when
// the map holds -1) and b = rhs[rhs_rows[m]]; a null map is the identity (row m). add .. minimum:
// c_lhs == c_rhs == C and out (n_out, C); cat: out (n_out, c_lhs + c_rhs) = [a | b]. Each input
// row occurs at most once in the maps. Outputs are fully overwritten; gradient rows of inputs
// absent from the output are 0.
struct CombineArgs {
  AlgebraOp op = AlgebraOp::add;
  Dtype dtype = Dtype::f32;  // feature dtype (f16, bf16, f32, f64)
  std::int64_t n_out = 0;
  std::int64_t n_lhs = 0;
  std::int64_t n_rhs = 0;
  std::int64_t c_lhs = 0;
  std::int64_t c_rhs = 0;
  const std::int64_t* lhs_rows = nullptr;  // (n_out) or null
  const std::int64_t* rhs_rows = nullptr;  // (n_out) or null
  double fill = 0.0;                       // rounded to dtype before use
  const void* lhs = nullptr;               // (n_lhs, c_lhs)  forward, backward
  const void* rhs = nullptr;               // (n_rhs, c_rhs)  forward, backward
  void* out = nullptr;                     // (n_out, C_out)  forward output
  const void* dout = nullptr;              // (n_out, C_out)  backward
  void* dlhs = nullptr;                    // (n_lhs, c_lhs)  backward output, or null
  void* drhs = nullptr;                    // (n_rhs, c_rhs)  backward output, or null
  Device device{};                         // where every pointer lives
};

// ---- coordinate utilities (downsample_coords, morton_codes, morton_order) ---------------------

struct DownsampleArgs {
  std::int64_t n = 0;
  const std::int32_t* coords = nullptr;  // (n, 4)
  Int3 stride{1, 1, 1};                  // each >= 1
  Device device{};                       // where coords live (outputs are allocated there)
};
struct DownsampleResult {
  Array coords;   // (M, 4) int32: unique (batch, floor_div(x, sx), ...), first-occurrence order
  Array inverse;  // (n) int64: input row -> output row
};

// Morton codes of x, y, z in [-2^20, 2^20) (checked by the caller) and/or the stable order by
// (batch, code).
struct MortonArgs {
  std::int64_t n = 0;
  std::int64_t cols = 4;                 // 4: (batch, x, y, z); 3: (x, y, z), batch 0
  const std::int32_t* coords = nullptr;  // (n, cols)
  std::int64_t* codes = nullptr;         // (n) output, or null
  std::int64_t* order = nullptr;         // (n) output permutation, or null
  Device device{};                       // where every pointer lives
};

// Row selection of prune (mask -> kept rows) and crop (box lo <= (x, y, z) < hi -> kept rows).
struct SelectArgs {
  std::int64_t n = 0;
  const std::uint8_t* mask = nullptr;    // (n) 0/1 (prune), or null
  const std::int32_t* coords = nullptr;  // (n, 4) (crop), or null
  Int3 lo{0, 0, 0};
  Int3 hi{0, 0, 0};
  Device device{};  // where mask / coords live (the kept rows are allocated there)
};
// sparse_collate: sample i's (n_i, cols_i) rows (cols 3: x, y, z; 4: batch ignored) -> (sum, 4)
// rows (i, x, y, z) and the counts n_i.
struct CollateSample {
  std::int64_t n = 0;
  std::int64_t cols = 4;
  const std::int32_t* coords = nullptr;
  Device device{};  // where coords live (every sample on one device)
};
struct CollateResult {
  Array coords;                      // (sum n_i, 4) int32
  std::vector<std::int64_t> counts;  // n_i
};
// dense: row -> flat cell of a (batch, X, Y, Z) grid, rows validated inside it by the caller.
struct DenseIndexArgs {
  std::int64_t n = 0;
  const std::int32_t* coords = nullptr;  // (n, 4)
  Int3 origin{0, 0, 0};
  std::array<std::int64_t, 3> size{0, 0, 0};
  std::int64_t* index = nullptr;  // (n) output
  Device device{};                // where every pointer lives
};
// from_dense: the non-zero sites of a (B, X, Y, Z) 0/1 mask in lexicographic order.
struct NonzeroArgs {
  std::int64_t batch = 0;
  std::array<std::int64_t, 3> size{0, 0, 0};
  const std::uint8_t* site = nullptr;  // (batch * X * Y * Z)
  Int3 origin{0, 0, 0};
  Device device{};  // where site lives (outputs are allocated there)
};
struct NonzeroResult {
  Array coords;                      // (K, 4) int32 (b, index + origin)
  Array index;                       // (K) int64 flat site
  std::vector<std::int64_t> counts;  // per batch
};

// ---- coordinate sets and relations on a device (src/backend/cuda/relation/hash.cu) ----
// Coordinates are contiguous (N, 4) int32 arrays on one device; every array below lives there.

// A device hash table over the rows of a coordinate array (backend/cuda/common/coord_table.cuh):
// slots int32 (capacity, a power of two), -1 = empty, each key holding its smallest row; linear
// probing from hash_coord(row) & mask. The coordinate array itself holds the keys.
// The smallest row that repeats an earlier row, its value and the earlier (first) row; row -1
// when every row is unique.
struct DuplicateRow {
  std::int64_t row = -1;
  std::int64_t first = -1;
  geometry::Coord4 value{0, 0, 0, 0};
};
// The coordinate index of a relation route (family "relation"), on the coordinates' device.
// cuda_hash: slots int32 (capacity), see above. cpu_hash (backend/cpu/relation/hash.cpp): slots
// int32 (capacity, 5), each a geometry::HostCoordSlot (key beside its row, -1 = empty), and the
// first repeated row found while inserting in row order (which its find_duplicate returns).
struct DeviceCoordTable {
  Array slots;
  std::uint64_t mask = 0;
  DuplicateRow duplicate;  // cpu_hash only
};
// Rows per batch id in [0, n_batches), and the smallest row whose batch id lies outside that
// range (bad_row -1 when none) with its id.
struct BatchHistogram {
  std::vector<std::int64_t> counts;
  std::int64_t bad_row = -1;
  std::int32_t bad_batch = 0;
};

// A generated output support (relation.cpp): unique candidates in first-occurrence order, the
// candidates enumerated input row major, then kernel row.
//   downsample: floor_div(c_i, s)                                   (one candidate per row)
//   expand:     (c_i + p - off_k) / s where that divides exactly on every axis
//   transposed: c_i * s + off_k - p
enum class SupportRule { downsample, expand, transposed };
struct DeviceSupportArgs {
  SupportRule rule = SupportRule::downsample;
  Array coords;                      // input (N, 4) int32
  KernelSpec spec;                   // kernel size and dilation give the offsets
  bool centered = true;              // geometry::kernel_offset's centered flag
  std::array<std::int64_t, 3> stride{1, 1, 1};
  std::array<std::int64_t, 3> padding{0, 0, 0};
};
struct DeviceSupportResult {
  Array coords;  // (M, 4) int32; undefined when a candidate leaves the int32 range
  // The first candidate (in enumeration order) with a coordinate outside int32: its input row
  // and the first such coordinate value (x, then y, then z); -1 when none.
  std::int64_t overflow_row = -1;
  std::int64_t overflow_value = 0;
  bool too_many_rows = false;  // cpu_hash: 2^31 unique rows or more (coords undefined)
};

// The edges of a relation: map[o, k] = the input row feeding (o, k) or -1, by the gather rule
// c_i = o*s + off_k - p or (scatter) o = c_i*s + off_k - p, probing the input table.
struct DeviceEdgeArgs {
  Array input;                        // (n_in, 4) int32, the rows input_table keys
  const DeviceCoordTable* input_table = nullptr;
  Array output;                       // (n_out, 4) int32
  KernelSpec spec;
  bool centered = true;
  std::int64_t kernel_volume = 1;
  std::array<std::int64_t, 3> stride{1, 1, 1};
  std::array<std::int64_t, 3> padding{0, 0, 0};
  bool scatter = false;
  // What the caller knows from the geometry alone (relation.cpp edge_hints), so a device route
  // need not read it back: the edge count (-1: unknown), and that the relation is the identity
  // (K == 1, output rows == input rows, every row reaching itself; implies n_edges == n_in).
  // The CPU route computes both anyway and checks them against the hints.
  std::int64_t known_edges = -1;
  bool known_identity = false;
};
// What a relation build produces (lattice/tensor/relation.h "Views"): the (n_out, K) int32 map
// and what the geometry or the build says about it, nothing else; every other view is derived
// from the map on first use by the entry points below. n_edges is the edge count when known
// without a device read-back (the caller's hint, or counted on the host by cpu_hash only when a
// hint is to be checked), else -1: counted on first use (RelationKernels::count_edges).
// An edge count on its way to the host: a device route counts the edges while it builds the map
// and queues the count's copy into pinned host memory behind an event, so that the relation's
// first n_edges() (a training step's backward, long after the build) waits for that event, which
// has normally passed, instead of synchronising the stream with all the work queued since.
struct PendingCount {
  virtual ~PendingCount() = default;
  // The count; when its copy has not landed yet: waits for it (a host sync) if `wait`, else -1.
  virtual std::int64_t get(bool wait) = 0;
};
struct DeviceEdges {
  Array map;
  std::int64_t n_edges = -1;
  bool identity = false;  // K == 1, n_in == n_out and map[o] == o for every row
  std::shared_ptr<PendingCount> pending_edges;  // with n_edges == -1: the count, in flight (or null)
};
// The output-major edge list from a map and its row CSR: in_idx / out_idx / k_idx (E) int32
// sorted by (o, k).
struct DeviceEdgeList {
  Array in_idx, out_idx, k_idx;
};
// The per-offset grouping of a map: k_ptr (K + 1) int64, k_in / k_out (E) int32 sorted by (k, o)
// (k_in the map's values, k_out its rows). Asked for with an unknown edge count (-1), the entry
// point finds the count by reading k_ptr back (one read-back on a device) and returns that copy
// in host_k_ptr (empty otherwise): the count and the host segment bounds in one read.
struct DeviceOffsetGrouping {
  Array k_ptr, k_in, k_out;
  std::vector<std::int64_t> host_k_ptr;
};
// Input-side views of a relation from its per-offset grouping: in_ptr (n_in + 1) int64 (edges per
// input row), kt_in / kt_out (E) int32 with each offset's edges sorted by input row.
struct DeviceInputGroupingArgs {
  std::int64_t n_in = 0;
  std::int64_t kernel_volume = 1;
  std::int64_t n_edges = 0;
  Array k_ptr, k_in, k_out;  // the per-offset grouping
};
struct DeviceInputGrouping {
  Array in_ptr, kt_in, kt_out;
};

// ---- index builders for data on a device (pooling edges, point grouping) ----------------------
// What the semantic layer computes with host loops for CPU data, done on the data's device.

// Global pooling: the rows of each batch (a stable grouping by batch id, rows ascending).
struct BatchEdgesArgs {
  std::int64_t n = 0;
  const std::int32_t* coords = nullptr;  // (n, 4)
  std::int64_t batches = -1;             // batch count when known (ids checked), else -1: max id + 1
  Device device{};
};
// trilinear_upsample3d: per fine row the coarse rows among its 8 trilinear neighbours with
// normalised float64 weights (the rule of ops/pool.cpp, bit for bit).
struct TrilinearEdgesArgs {
  std::int64_t n_coarse = 0;
  std::int64_t n_fine = 0;
  const std::int32_t* coarse = nullptr;  // (n_coarse, 4) unique rows
  const std::int32_t* fine = nullptr;    // (n_fine, 4)
  const std::int32_t* coarse_slots = nullptr;  // cached DeviceCoordTable over coarse, or null
  std::uint64_t coarse_mask = 0;
  Int3 ratio{2, 2, 2};
  Device device{};
};
struct PoolEdgeList {
  Array out_ptr;  // (n_out + 1) int64
  Array in_idx;   // (E) int32
  Array weights;  // (E) float64 (trilinear only)
  std::int64_t negative_row = -1;   // batch edges: first row with a negative batch id (nothing
  std::int32_t negative_batch = 0;  //   else filled when >= 0), and that id
  std::int64_t first_empty = -1;    // batch edges: first batch without rows, or -1
};

// Batch ids of points: int32 or int64 (n), checked to lie in [0, 2^31) and narrowed to int32.
struct BatchIdsArgs {
  std::int64_t n = 0;
  Dtype dtype = Dtype::i32;
  const void* ids = nullptr;
  Device device{};
};
struct BatchIdsResult {
  Array batch;                // (n) int32 (undefined when bad_row >= 0)
  std::int64_t bad_row = -1;  // first id outside [0, 2^31), and its value
  std::int64_t bad_value = 0;
};
// The CSR of points per voxel: a stable grouping of the points by voxel row.
struct PointGroupArgs {
  std::int64_t n_points = 0;
  std::int64_t n_voxels = 0;
  const std::int64_t* inverse = nullptr;  // (P) point -> voxel row
  Device device{};
};
struct PointGroupResult {
  Array voxel_ptr;  // (M + 1) int64
  Array point_idx;  // (P) int64, ascending within each voxel
};

// ---- batch normalisation (family "batch_norm") -------------------------------------------------

// Batch norm over the n rows of x (n, c), then an optional ReLU. x, y, dy, dx of `dtype`; every
// per-channel vector (gamma, beta, running stats, mean, invstd, dgamma, dbeta) of the accumulation
// dtype Accum<T> (f32 for f16 / bf16 / f32 features, f64 for f64). Null gamma means 1, null beta 0.
//
// forward, training: mean / invstd (biased variance) of the rows are written to `mean` /
//   `invstd`; running_mean / running_var (when not null) become (1 - momentum) * running +
//   momentum * batch (the unbiased variance, n / (n - 1)); n >= 2 (checked by the semantic layer).
// forward, eval: mean = running_mean, invstd = 1 / sqrt(running_var + eps) are written to
//   `mean` / `invstd` (what backward reads), running stats required and not modified.
// Both: y = (x - mean) * invstd * gamma + beta, then max(y, 0) when relu.
// backward: dy' = relu ? (y > 0 ? dy : 0) : dy (y: the forward's output); xhat = (x - mean) * invstd;
//   dbeta = sum dy', dgamma = sum dy' * xhat (when not null; both or neither);
//   dx (when not null) = gamma * invstd * (dy' - mean(dy') - xhat * mean(dy' * xhat)) in training,
//   gamma * invstd * dy' in eval.
// Sums over rows run in a fixed order (backend/common/batch_norm.h: fixed row blocks whose
// partials are summed in a fixed lane order), never depending on the thread count or the grid.
struct BatchNormArgs {
  Dtype dtype = Dtype::f32;
  std::int64_t n = 0;
  std::int64_t c = 0;
  bool training = true;
  bool relu = false;
  double eps = 1e-5;
  double momentum = 0.1;
  const void* x = nullptr;        // (n, c)       forward, backward
  const void* gamma = nullptr;    // (c) or null  forward, backward
  const void* beta = nullptr;     // (c) or null  forward
  const void* residual = nullptr; // (n, c) or null  forward: added to the normalised value before the ReLU
  void* running_mean = nullptr;   // (c) or null  forward (updated in place in training)
  void* running_var = nullptr;    // (c) or null  forward
  void* y = nullptr;              // (n, c)       forward output
  void* mean = nullptr;           // (c)          forward output, backward input
  void* invstd = nullptr;         // (c)          forward output, backward input
  const void* y_saved = nullptr;  // (n, c)       backward with relu: the forward's y
  const void* dy = nullptr;       // (n, c)       backward
  void* dx = nullptr;             // (n, c) or null   backward output
  void* dgamma = nullptr;         // (c) or null      backward output
  void* dbeta = nullptr;          // (c) or null      backward output
  void* dresidual = nullptr;      // (n, c) or null   backward output (relu only): dy', dy where y > 0
  Device device{};
};

}  // namespace lattice::backend
