// Sparse algebra, semantic layer: validates, aligns two coordinate sets through the route layer
// (the fast route probes each set's own coordinate index), decides the output's identity and runs
// the combine passes.
#include "lattice/ops/algebra.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "backend/kernel_table.h"
#include "lattice/core/error.h"
#include "ops/common.h"
#include "tensor/coord_index.h"

namespace lattice::ops {

namespace {

constexpr std::string_view kFamily = "algebra";

std::int64_t find_in_index(const void* index, const geometry::Coord4& c) {
  return static_cast<const CoordIndex*>(index)->find(c);
}

backend::CoordFinder finder(const CoordIndex& index) { return {&index, find_in_index}; }

// `arr` readable on the host: itself on the CPU, else a host copy (device results the semantic
// layer inspects: row maps and output coordinates).
Array on_host(const Array& arr) { return arr.device().is_cpu() ? arr : arr.to(Device::cpu()); }

// `arr` contiguous; an array without elements becomes a fresh empty one (torch may export a
// zero-row tensor with strides such as (1, 0), which a CUDA clone would refuse).
Array packed(const Array& arr) {
  return arr.numel() == 0 ? Array::empty(arr.shape(), arr.dtype(), arr.device()) : arr.contiguous();
}

// "[op] arg: expected a tensor on <expected>, got <got>" when the devices differ.
void check_device(std::string_view op, std::string_view arg, Device expected, Device got) {
  if (got != expected) throw_value_error(op, arg, "a tensor on " + to_string(expected), to_string(got));
}

const backend::AlgebraKernels& kernels_for(const Explanation& e) {
  const backend::AlgebraKernels* k = backend::find_algebra_kernels(chosen_or_throw(e));
  LATTICE_ASSERT(k != nullptr, "admitted algebra route has no kernels in this build");
  return *k;
}

void check_sets(std::string_view op, const std::shared_ptr<CoordinateSet>& lhs,
                const std::shared_ptr<CoordinateSet>& rhs) {
  if (!lhs) throw_value_error(op, "lhs", "a coordinate set", "none");
  if (!rhs) throw_value_error(op, "rhs", "a coordinate set", "none");
  check_device(op, "rhs", lhs->coords().device(), rhs->coords().device());
  if (lhs->stride() != rhs->stride()) {
    throw_value_error(op, "rhs", "stride " + to_string(lhs->stride()) + " (the stride of lhs)",
                      "stride " + to_string(rhs->stride()));
  }
}

AlgebraProblem align_problem(std::string_view op, const CoordinateSet& lhs,
                             const CoordinateSet& rhs, Join join) {
  AlgebraProblem p;
  p.op = std::string(op);
  p.pass = AlgebraPass::align;
  p.join = join;
  p.dtype = Dtype::i32;
  p.device = lhs.coords().device();
  p.n_lhs = lhs.size();
  p.n_rhs = rhs.size();
  p.same_key = lhs.key() == rhs.key();
  return p;
}

// rows == 0, 1, ..., n-1.
bool is_iota(const Array& rows_any, std::int64_t n) {
  if (rows_any.dim(0) != n) return false;
  const Array rows = on_host(rows_any);
  const auto* r = rows.data<std::int64_t>();
  for (std::int64_t k = 0; k < n; ++k)
    if (r[k] != k) return false;
  return true;
}

// Rows per batch of a new output support, when every input that contributes rows has counts.
std::optional<std::vector<std::int64_t>> output_batch_counts(const Alignment& a,
                                                             const Array& coords_any) {
  const std::int64_t m = coords_any.dim(0);
  const Array lhs_rows = on_host(a.lhs_rows);
  const auto* l = lhs_rows.data<std::int64_t>();
  bool from_lhs = false, from_rhs = false;
  for (std::int64_t k = 0; k < m; ++k) (l[k] >= 0 ? from_lhs : from_rhs) = true;
  std::size_t n_batches = 0;
  for (const auto& [used, set] :
       {std::pair{from_lhs, a.lhs.get()}, std::pair{from_rhs, a.rhs.get()}}) {
    if (!used) continue;
    if (!set->batch_counts()) return std::nullopt;
    n_batches = std::max(n_batches, set->batch_counts()->size());
  }
  std::vector<std::int64_t> counts(n_batches, 0);
  const Array coords = on_host(coords_any);
  const auto* c = coords.data<std::int32_t>();
  for (std::int64_t k = 0; k < m; ++k) ++counts[static_cast<std::size_t>(c[4 * k])];
  return counts;
}

void check_feats(std::string_view op, std::string_view arg, const Array& feats, std::int64_t rows) {
  if (!feats.defined())
    throw_value_error(op, arg, "an (N=" + std::to_string(rows) + ", C) float array", "nothing");
  if (!is_floating(feats.dtype()))
    throw_type_error(op, arg, "float16, bfloat16, float32 or float64 features",
                     std::string(to_string(feats.dtype())));
  if (feats.ndim() != 2 || feats.dim(0) != rows)
    throw_value_error(op, arg, "shape (N=" + std::to_string(rows) + ", C)",
                      format_shape(feats.shape()));
}

// Validates both feature arrays against the alignment; returns the output column count.
std::int64_t check_operands(const Alignment& a, AlgebraOp op, const Array& lhs, const Array& rhs) {
  check_feats(a.op, "lhs", lhs, a.lhs->size());
  check_feats(a.op, "rhs", rhs, a.rhs->size());
  if (rhs.dtype() != lhs.dtype())
    throw_type_error(a.op, "rhs",
                     std::string(to_string(lhs.dtype())) + " features (the dtype of lhs)",
                     std::string(to_string(rhs.dtype())));
  check_device(a.op, "lhs", a.lhs->coords().device(), lhs.device());
  check_device(a.op, "rhs", lhs.device(), rhs.device());
  if (op == AlgebraOp::cat) return lhs.dim(1) + rhs.dim(1);
  if (rhs.dim(1) != lhs.dim(1))
    throw_value_error(a.op, "rhs",
                      "C=" + std::to_string(lhs.dim(1)) + " feature columns (those of lhs)",
                      std::to_string(rhs.dim(1)));
  return lhs.dim(1);
}

AlgebraProblem combine_problem(const Alignment& a, AlgebraOp op, AlgebraPass pass, Dtype dtype,
                               Device device, std::int64_t channels) {
  AlgebraProblem p;
  p.op = a.op;
  p.pass = pass;
  p.join = a.join;
  p.combine = op;
  p.dtype = dtype;
  p.device = device;
  p.n_lhs = a.lhs->size();
  p.n_rhs = a.rhs->size();
  p.n_out = a.size();
  p.channels = channels;
  p.same_key = a.identity;
  return p;
}

backend::CombineArgs combine_args(const Alignment& a, AlgebraOp op, const Array& lhs,
                                  const Array& rhs, double fill) {
  backend::CombineArgs args;
  args.op = op;
  args.dtype = lhs.dtype();
  args.n_out = a.size();
  args.n_lhs = a.lhs->size();
  args.n_rhs = a.rhs->size();
  args.c_lhs = lhs.dim(1);
  args.c_rhs = rhs.dim(1);
  if (!a.identity) {
    args.lhs_rows = a.lhs_rows.data<std::int64_t>();
    args.rhs_rows = a.rhs_rows.data<std::int64_t>();
  }
  args.fill = fill;
  args.lhs = lhs.raw_data();
  args.rhs = rhs.raw_data();
  args.device = lhs.device();
  return args;
}

std::string_view public_name(AlgebraOp op) {
  switch (op) {
    case AlgebraOp::add:
      return "sparse_add";
    case AlgebraOp::sub:
      return "sparse_sub";
    case AlgebraOp::mul:
      return "sparse_mul";
    case AlgebraOp::maximum:
      return "sparse_maximum";
    case AlgebraOp::minimum:
      return "sparse_minimum";
    case AlgebraOp::cat:
      return "sparse_cat_aligned";
  }
  return "sparse_algebra";
}

SparseTensor run_binary(AlgebraOp op, const SparseTensor& lhs, const SparseTensor& rhs,
                        const AlgebraOptions& options) {
  const auto a = align(public_name(op), lhs.coordinate_set(), rhs.coordinate_set(),
                       options.join.value_or(default_join(op)), options.policy);
  Array feats = combine_forward(*a, op, lhs.feats(), rhs.feats(), {options.fill, options.policy});
  return SparseTensor(a->output, feats);
}

}  // namespace

std::optional<Join> join_from_string(std::string_view name) {
  for (Join j : {Join::inner, Join::left, Join::right, Join::outer})
    if (to_string(j) == name) return j;
  return std::nullopt;
}

Join default_join(AlgebraOp op) {
  return (op == AlgebraOp::add || op == AlgebraOp::sub) ? Join::outer : Join::inner;
}

std::shared_ptr<const Alignment> align(std::string_view op,
                                       const std::shared_ptr<CoordinateSet>& lhs,
                                       const std::shared_ptr<CoordinateSet>& rhs, Join join,
                                       const RoutePolicy& policy) {
  check_sets(op, lhs, rhs);
  auto out = std::make_shared<Alignment>();
  out->op = std::string(op);
  out->join = join;
  out->lhs = lhs;
  out->rhs = rhs;
  if (lhs->key() == rhs->key()) {  // identity fast path: the same rows, nothing to align
    out->identity = true;
    out->output = lhs;
    return out;
  }
  // On the CPU, building (or fetching) both indexes also rejects repeated rows, which would make
  // the alignment ambiguous; device routes hash the sets themselves and check them there.
  const Device device = lhs->coords().device();
  const CoordIndex* lhs_index = device.is_cpu() ? &lhs->index(op) : nullptr;
  const CoordIndex* rhs_index = device.is_cpu() ? &rhs->index(op) : nullptr;
  const Explanation e = explain(align_problem(op, *lhs, *rhs, join), backend::device_caps(),
                                effective_policy(policy, kFamily));
  const backend::AlgebraKernels& k = kernels_for(e);
  backend::AlignArgs args;
  args.join = join;
  args.n_lhs = lhs->size();
  args.n_rhs = rhs->size();
  args.lhs = lhs->coords().data<std::int32_t>();
  args.rhs = rhs->coords().data<std::int32_t>();
  if (lhs_index) args.lhs_index = finder(*lhs_index);
  if (rhs_index) args.rhs_index = finder(*rhs_index);
  args.device = device;
  args.op = op;
  backend::AlignResult r = k.align(args);
  out->lhs_rows = std::move(r.lhs_rows);
  out->rhs_rows = std::move(r.rhs_rows);
  if (is_iota(out->lhs_rows, lhs->size())) {
    out->output = lhs;
  } else if (is_iota(out->rhs_rows, rhs->size())) {
    out->output = rhs;
  } else {
    auto counts = output_batch_counts(*out, r.coords);
    out->output = CoordinateSet::create(r.coords, lhs->stride(), std::move(counts), false, op);
  }
  return out;
}

Array combine_forward(const Alignment& a, AlgebraOp op, const Array& lhs_feats,
                      const Array& rhs_feats, const CombineOptions& options) {
  const std::int64_t c_out = check_operands(a, op, lhs_feats, rhs_feats);
  const Explanation e = explain(
      combine_problem(a, op, AlgebraPass::forward, lhs_feats.dtype(), lhs_feats.device(), c_out),
      backend::device_caps(), effective_policy(options.policy, kFamily));
  const backend::AlgebraKernels& k = kernels_for(e);
  const Array lhs = packed(lhs_feats);
  const Array rhs = packed(rhs_feats);
  Array out = Array::empty({a.size(), c_out}, lhs.dtype(), lhs.device());
  backend::CombineArgs args = combine_args(a, op, lhs, rhs, options.fill);
  args.out = out.raw_data();
  k.forward(args);
  return out;
}

CombineGrads combine_backward(const Alignment& a, AlgebraOp op, const Array& lhs_feats,
                              const Array& rhs_feats, const Array& grad_out, bool need_lhs,
                              bool need_rhs, const CombineOptions& options) {
  const std::int64_t c_out = check_operands(a, op, lhs_feats, rhs_feats);
  if (!grad_out.defined()) throw_value_error(a.op, "grad_out", "an (M, C) array", "nothing");
  if (grad_out.dtype() != lhs_feats.dtype())
    throw_type_error(a.op, "grad_out",
                     std::string(to_string(lhs_feats.dtype())) + " (the dtype of lhs)",
                     std::string(to_string(grad_out.dtype())));
  check_device(a.op, "grad_out", lhs_feats.device(), grad_out.device());
  if (grad_out.ndim() != 2 || grad_out.dim(0) != a.size() || grad_out.dim(1) != c_out)
    throw_value_error(a.op, "grad_out",
                      "shape (M=" + std::to_string(a.size()) + ", C=" + std::to_string(c_out) + ")",
                      format_shape(grad_out.shape()));
  CombineGrads grads;
  if (!need_lhs && !need_rhs) return grads;
  const Explanation e = explain(
      combine_problem(a, op, AlgebraPass::backward, lhs_feats.dtype(), lhs_feats.device(), c_out),
      backend::device_caps(), effective_policy(options.policy, kFamily));
  const backend::AlgebraKernels& k = kernels_for(e);
  const Array lhs = packed(lhs_feats);
  const Array rhs = packed(rhs_feats);
  const Array dout = packed(grad_out);
  backend::CombineArgs args = combine_args(a, op, lhs, rhs, options.fill);
  args.dout = dout.raw_data();
  if (need_lhs) {
    grads.lhs = Array::empty({lhs.dim(0), lhs.dim(1)}, lhs.dtype(), lhs.device());
    args.dlhs = grads.lhs.raw_data();
  }
  if (need_rhs) {
    grads.rhs = Array::empty({rhs.dim(0), rhs.dim(1)}, rhs.dtype(), rhs.device());
    args.drhs = grads.rhs.raw_data();
  }
  k.backward(args);
  return grads;
}

Explanation explain_align(std::string_view op, const CoordinateSet& lhs, const CoordinateSet& rhs,
                          Join join) {
  return explain(align_problem(op, lhs, rhs, join), backend::device_caps(),
                 effective_policy({}, kFamily));
}

Explanation explain_combine(const Alignment& a, AlgebraOp op, AlgebraPass pass, Dtype dtype,
                            std::int64_t channels) {
  return explain(combine_problem(a, op, pass, dtype, a.lhs->coords().device(), channels),
                 backend::device_caps(), effective_policy({}, kFamily));
}

SparseTensor sparse_add(const SparseTensor& lhs, const SparseTensor& rhs, const AlgebraOptions& o) {
  return run_binary(AlgebraOp::add, lhs, rhs, o);
}
SparseTensor sparse_sub(const SparseTensor& lhs, const SparseTensor& rhs, const AlgebraOptions& o) {
  return run_binary(AlgebraOp::sub, lhs, rhs, o);
}
SparseTensor sparse_mul(const SparseTensor& lhs, const SparseTensor& rhs, const AlgebraOptions& o) {
  return run_binary(AlgebraOp::mul, lhs, rhs, o);
}
SparseTensor sparse_maximum(const SparseTensor& lhs, const SparseTensor& rhs,
                            const AlgebraOptions& o) {
  return run_binary(AlgebraOp::maximum, lhs, rhs, o);
}
SparseTensor sparse_minimum(const SparseTensor& lhs, const SparseTensor& rhs,
                            const AlgebraOptions& o) {
  return run_binary(AlgebraOp::minimum, lhs, rhs, o);
}
SparseTensor sparse_cat_aligned(const SparseTensor& lhs, const SparseTensor& rhs,
                                const AlgebraOptions& o) {
  return run_binary(AlgebraOp::cat, lhs, rhs, o);
}

}  // namespace lattice::ops
