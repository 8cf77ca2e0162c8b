// Sparse pooling (SEMANTICS.md "Pooling"). Every op here reduces, per output row, the input rows
// of its edges:
//   local pooling   pool3d / sum_pool3d / avg_pool3d / max_pool3d over the forward relation
//                   (or onto a target): sum, avg (divides by the edges of that output row, not
//                   K), max (per channel; ties go to the first edge in (input row, kernel row)
//                   order, i.e. the smallest input row, and so does the whole gradient);
//   global pooling  global_sum_pool / global_avg_pool / global_max_pool: the rows of each batch
//                   into a dense (B, C) array; B = len(batch_counts) when the input carries
//                   them, else max batch id + 1; an empty batch gives 0 (sum, avg) and is a
//                   ValueError for max;
//   pool_transpose3d      the average of the coarse rows of the transposed relation onto a
//                         generated or a given fine support;
//   trilinear_upsample3d  fine row = sum of trilinear weights * the (up to) 8 coarse rows whose
//                         centres surround the fine row's centre (see plan_trilinear_upsample).
// Output rows without edges are 0 (max: 0, and no gradient). NaN wins a max (it propagates).
// Features: one float dtype (f16, bf16, f32; f64 for tests); f16/bf16 accumulate in f32 and are
// rounded once. Every op is differentiable in the features (pool_backward).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "lattice/core/array.h"
#include "lattice/core/vocab.h"
#include "lattice/route/route.h"
#include "lattice/tensor/relation.h"
#include "lattice/tensor/sparse_tensor.h"

namespace lattice::ops {

struct PoolOptions {
  Int3 kernel_size{2, 2, 2};
  Int3 stride{2, 2, 2};
  Int3 padding{0, 0, 0};
  Int3 dilation{1, 1, 1};
  bool expand = false;        // local pooling without a target: spconv-style output growth
  bool deterministic = true;  // require bitwise-reproducible routes
  RoutePolicy policy;         // force a route (fails loudly when it is not admitted)
};

// A validated pooling: its edges (output-major) and output support. Cheap to copy; relation
// arrays are shared with the input's relation cache.
struct PoolPlan {
  std::string op;
  PoolMode mode = PoolMode::max;
  PoolEdges edges = PoolEdges::forward;
  KernelSpec spec;  // relation edges only
  bool deterministic = true;
  RoutePolicy policy;
  std::int64_t n_in = 0;
  std::int64_t n_out = 0;
  std::int64_t n_edges = 0;
  Array out_ptr;  // int64 (n_out + 1): edges of output row o are [out_ptr[o], out_ptr[o+1])
  Array in_idx;   // int32 (E): input row of each edge
  Array weights;  // float64 (E), mode weighted only
  std::shared_ptr<const Relation> relation;  // relation edges; null for batch / trilinear
  std::shared_ptr<CoordinateSet> input;
  std::shared_ptr<CoordinateSet> output;  // null for global pooling (dense output)
};

// Local pooling over the forward relation (target: onto the target's rows). mode: sum, avg or max.
PoolPlan plan_pool(std::string_view op, PoolMode mode, const std::shared_ptr<CoordinateSet>& x,
                   const PoolOptions& options, const std::shared_ptr<CoordinateSet>& target = {});
// Global pooling by batch (mode: sum, avg or max). Batch ids must be >= 0; max raises
// ValueError when a batch has no rows.
PoolPlan plan_global_pool(std::string_view op, PoolMode mode,
                          const std::shared_ptr<CoordinateSet>& x, const PoolOptions& options = {});
// Average of the coarse rows of the transposed relation (indexed offsets 0..K-1 times dilation):
// fine o gets the mean of x[i] over the edges o == c_i*stride + off_k - padding. Without a target
// the output is the relation's generated support; output stride = x.stride / stride (exact).
PoolPlan plan_pool_transpose(std::string_view op, const std::shared_ptr<CoordinateSet>& x,
                             const PoolOptions& options,
                             const std::shared_ptr<CoordinateSet>& target = {});
// Trilinear upsampling from x (stride S_c) to a fine support (stride S_f, S_c divisible by
// S_f per axis, r = S_c / S_f). Physical centres: coarse row c at (c + 0.5)*S_c, fine row f at
// (f + 0.5)*S_f per axis. Per axis u = (f + 0.5)/r - 0.5 = (2f + 1 - r)/(2r) in coarse lattice
// units, lo = floor(u), t = u - lo; the coarse neighbours are lo (weight 1 - t) and lo + 1
// (weight t); a corner's weight is the product over the three axes, batch equal. Corners that
// are absent from x or have weight 0 are dropped and the remaining weights are divided by their
// sum; a fine row with none gets 0. The arithmetic is exact in integers up to the final
// division, so equal geometry gives equal weights. Edges of a fine row are in corner order
// (x-major, z fastest, lo before lo + 1). The fine support is `target` (its stride fixes r;
// `stride`, when given, must equal S_c / S_f) or, without a target, the children
// c*stride + (0..stride-1) of every coarse row (deduplicated, first-occurrence order; the
// generative relation's support), with `stride` defaulting to 2.
PoolPlan plan_trilinear_upsample(std::string_view op, const std::shared_ptr<CoordinateSet>& x,
                                 std::optional<Int3> stride,
                                 const std::shared_ptr<CoordinateSet>& target,
                                 const PoolOptions& options = {});

struct PoolOutput {
  Array out;     // (n_out, C) in the feature dtype (global pooling: (B, C))
  Array argmax;  // mode max: int32 (n_out, C), the winning input row or -1; else undefined
};
// feats (n_in, C) float on the coordinates' device.
PoolOutput pool_forward(const PoolPlan& plan, const Array& feats);
// The features' gradient (n_in, C) from grad_out (n_out, C); mode max needs the forward's argmax.
Array pool_backward(const PoolPlan& plan, const Array& grad_out, const Array* argmax = nullptr);
// The route decision for one pass; `feats` (forward) or `grad_out` (input_grad) gives dtype and C.
Explanation explain_pool(const PoolPlan& plan, const Array& feats,
                         PoolPass pass = PoolPass::forward);

// One-call conveniences (plan + forward).
SparseTensor pool3d(const SparseTensor& x, PoolMode mode, const PoolOptions& options,
                    const SparseTensor* target = nullptr);
SparseTensor sum_pool3d(const SparseTensor& x, const PoolOptions& options);
SparseTensor avg_pool3d(const SparseTensor& x, const PoolOptions& options);
SparseTensor max_pool3d(const SparseTensor& x, const PoolOptions& options);
Array global_sum_pool(const SparseTensor& x);
Array global_avg_pool(const SparseTensor& x);
Array global_max_pool(const SparseTensor& x);
SparseTensor pool_transpose3d(const SparseTensor& x, const PoolOptions& options,
                              const SparseTensor* target = nullptr);
SparseTensor trilinear_upsample3d(const SparseTensor& x, std::optional<Int3> stride,
                                  const SparseTensor* target = nullptr);

}  // namespace lattice::ops
