// Sparse algebra (SEMANTICS.md "Sparse algebra and coordinate utilities"): two sparse tensors are
// aligned by coordinate value with a join, then their aligned feature rows are combined
// elementwise (add, sub, mul, maximum, minimum) or concatenated (cat).
//
// Joins (output rows): inner = lhs rows found in rhs, lhs order; left = lhs rows; right = rhs
// rows; outer = lhs rows, then the rhs rows absent from lhs in rhs order. A side missing at an
// output row reads the constant `fill` (default 0, rounded to the feature dtype) and gets no
// gradient. When both sides share one coordinate key nothing is aligned (identity fast path).
// Defaults: add/sub outer; mul/maximum/minimum/cat inner. Strides must match.
//
// Gradients (both operands): add/sub/mul as usual; maximum/minimum send the whole gradient to the
// side they chose, which is lhs on ties (and lhs when lhs is NaN; NaN propagates); cat splits the
// gradient by columns. Each input row occurs at most once in an alignment, so gradients are
// gathered, never summed.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "lattice/core/array.h"
#include "lattice/route/route.h"
#include "lattice/tensor/coordinate_set.h"
#include "lattice/tensor/sparse_tensor.h"

namespace lattice::ops {

std::optional<Join> join_from_string(std::string_view name);
// add/sub: outer; mul/maximum/minimum/cat: inner.
Join default_join(AlgebraOp op);

// The aligned rows of two coordinate sets. Output identity rule: the output *is* an input's
// coordinate set (same key) exactly when its rows are that input's rows in that input's order,
// lhs checked first: same key (identity: nothing aligned); left joins -> lhs; right joins -> rhs;
// inner joins that find every lhs row and outer joins without rhs-only rows -> lhs; an inner join
// whose rows are exactly rhs's in rhs order -> rhs. Otherwise the output is a new set (same
// stride; batch_counts when every input that contributes rows has them, counted per batch).
struct Alignment {
  std::string op;  // public op name, for errors
  Join join = Join::outer;
  bool identity = false;  // lhs and rhs share one key: rows are combined in place
  std::shared_ptr<CoordinateSet> lhs;
  std::shared_ptr<CoordinateSet> rhs;
  std::shared_ptr<CoordinateSet> output;
  Array lhs_rows;  // (M) int64: lhs row of output row m, or -1; undefined when identity
  Array rhs_rows;  // (M) int64: likewise for rhs
  std::int64_t size() const { return output->size(); }
};

// Aligns `lhs` and `rhs` by coordinate value. Raises ValueError (naming `op`) when strides differ
// or a set repeats a row.
std::shared_ptr<const Alignment> align(std::string_view op,
                                       const std::shared_ptr<CoordinateSet>& lhs,
                                       const std::shared_ptr<CoordinateSet>& rhs, Join join,
                                       const RoutePolicy& policy = {});

struct CombineOptions {
  double fill = 0.0;   // value of a missing side
  RoutePolicy policy;  // force a route (fails loudly when it is not admitted)
};

// (M, C) for add/sub/mul/maximum/minimum (lhs and rhs have C columns), (M, C_lhs + C_rhs) for
// cat. lhs_feats (n_lhs, C_lhs) and rhs_feats (n_rhs, C_rhs) share one float dtype.
Array combine_forward(const Alignment& alignment, AlgebraOp op, const Array& lhs_feats,
                      const Array& rhs_feats, const CombineOptions& options = {});

struct CombineGrads {
  Array lhs;  // (n_lhs, C_lhs), undefined when not requested
  Array rhs;  // (n_rhs, C_rhs), undefined when not requested
};
CombineGrads combine_backward(const Alignment& alignment, AlgebraOp op, const Array& lhs_feats,
                              const Array& rhs_feats, const Array& grad_out, bool need_lhs,
                              bool need_rhs, const CombineOptions& options = {});

// Route decisions without running: the alignment of two sets, or one combine pass.
Explanation explain_align(std::string_view op, const CoordinateSet& lhs, const CoordinateSet& rhs,
                          Join join);
Explanation explain_combine(const Alignment& alignment, AlgebraOp op, AlgebraPass pass, Dtype dtype,
                            std::int64_t channels);

// One-call conveniences on SparseTensors (align + forward). `join` defaults per op.
struct AlgebraOptions {
  std::optional<Join> join;
  double fill = 0.0;
  RoutePolicy policy;
};
SparseTensor sparse_add(const SparseTensor& lhs, const SparseTensor& rhs,
                        const AlgebraOptions& options = {});
SparseTensor sparse_sub(const SparseTensor& lhs, const SparseTensor& rhs,
                        const AlgebraOptions& options = {});
SparseTensor sparse_mul(const SparseTensor& lhs, const SparseTensor& rhs,
                        const AlgebraOptions& options = {});
SparseTensor sparse_maximum(const SparseTensor& lhs, const SparseTensor& rhs,
                            const AlgebraOptions& options = {});
SparseTensor sparse_minimum(const SparseTensor& lhs, const SparseTensor& rhs,
                            const AlgebraOptions& options = {});
SparseTensor sparse_cat_aligned(const SparseTensor& lhs, const SparseTensor& rhs,
                                const AlgebraOptions& options = {});

}  // namespace lattice::ops
