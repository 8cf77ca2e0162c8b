// Batch normalisation (+ fused ReLU), semantic layer: validates the feature matrix and the
// per-channel arrays, describes the problem, asks the route table (family "batch_norm") and calls
// the chosen route's kernels. No compute here.
#include "lattice/ops/batch_norm.h"

#include <cmath>
#include <string>

#include "backend/kernel_table.h"
#include "lattice/core/error.h"
#include "ops/common.h"

namespace lattice::ops {

namespace {

constexpr std::string_view kFamily = "batch_norm";

// f32 for f16 / bf16 / f32 features, f64 for f64: the dtype of every per-channel array.
Dtype accum_dtype(Dtype features) { return features == Dtype::f64 ? Dtype::f64 : Dtype::f32; }

std::string shape_of(const Array& a) { return format_shape(a.shape()); }

// `arr` contiguous; an array without elements becomes a fresh empty one (torch may export a
// zero-row tensor with strides such as (1, 0)).
Array packed(const Array& arr) {
  return arr.numel() == 0 ? Array::empty(arr.shape(), arr.dtype(), arr.device()) : arr.contiguous();
}

void check_features(const std::string& op, std::string_view what, const Array& x) {
  if (!x.defined()) throw_value_error(op, what, "an (N, C) feature matrix", "nothing");
  if (!is_floating(x.dtype()))
    throw_type_error(op, what, "float16, bfloat16, float32 or float64 features", to_string(x.dtype()));
  if (x.ndim() != 2) throw_value_error(op, what, "a 2-D (N, C) feature matrix", "shape " + shape_of(x));
}

// An (N, C) matrix read next to the input (grad_out, residual): x's dtype, device and shape.
void check_like_input(const std::string& op, std::string_view what, const Array& a, const Array& x) {
  check_features(op, what, a);
  if (a.dtype() != x.dtype())
    throw_type_error(op, what, std::string(to_string(x.dtype())) + " (the dtype of the input)",
                     to_string(a.dtype()));
  if (a.device() != x.device()) throw_value_error(op, what, "a tensor on " + to_string(x.device()), to_string(a.device()));
  if (a.shape() != x.shape())
    throw_value_error(op, what, "shape " + shape_of(x) + " (that of the input)", shape_of(a));
}

// A per-channel array: (C) of the accumulation dtype on x's device; written in place when
// `written` (running statistics), so it must be contiguous.
void check_vector(const std::string& op, std::string_view what, const Array& v, const Array& x, bool written) {
  if (!v.defined()) return;
  const Dtype acc = accum_dtype(x.dtype());
  if (v.dtype() != acc)
    throw_type_error(op, what,
                     std::string(to_string(acc)) + " (per-channel values of " + std::string(to_string(x.dtype())) +
                         " features)",
                     to_string(v.dtype()));
  if (v.device() != x.device()) throw_value_error(op, what, "a tensor on " + to_string(x.device()), to_string(v.device()));
  if (v.ndim() != 1 || v.dim(0) != x.dim(1))
    throw_value_error(op, what, "shape (C=" + std::to_string(x.dim(1)) + ",)", shape_of(v));
  if (written && !v.is_contiguous())
    throw_value_error(op, what, "a contiguous tensor (it is updated in place)", "a strided one");
}

void check_options(const BatchNormOptions& o) {
  if (!(o.eps > 0.0) || !std::isfinite(o.eps))
    throw_value_error(o.op, "eps", "a positive finite value", std::to_string(o.eps));
  if (!(o.momentum >= 0.0 && o.momentum <= 1.0))
    throw_value_error(o.op, "momentum", "a value in [0, 1]", std::to_string(o.momentum));
}

BatchNormProblem problem_of(const Array& x, BatchNormPass pass, const BatchNormOptions& o, bool residual = false) {
  BatchNormProblem p;
  p.residual = residual;
  p.op = o.op;
  p.pass = pass;
  p.training = o.training;
  p.relu = o.relu;
  p.dtype = x.dtype();
  p.device = x.device();
  p.n_rows = x.ndim() == 2 ? x.dim(0) : 0;
  p.channels = x.ndim() == 2 ? x.dim(1) : 0;
  return p;
}

const backend::BatchNormKernels& kernels_for(const BatchNormProblem& p, const RoutePolicy& policy) {
  const RouteId id = decide_or_throw(p, backend::device_caps(), effective_policy(policy, kFamily));
  const backend::BatchNormKernels* k = backend::find_batch_norm_kernels(id);
  LATTICE_ASSERT(k != nullptr, "admitted batch_norm route has no kernels in this build");
  return *k;
}

const void* ptr_or_null(const Array& a) { return a.defined() ? a.raw_data() : nullptr; }

// The arguments both passes share: shape, mode, options, x and gamma on x's device.
backend::BatchNormArgs base_args(const Array& x, const Array& w, const BatchNormOptions& o) {
  backend::BatchNormArgs a;
  a.dtype = x.dtype();
  a.n = x.dim(0);
  a.c = x.dim(1);
  a.training = o.training;
  a.relu = o.relu;
  a.eps = o.eps;
  a.momentum = o.momentum;
  a.x = x.raw_data();
  a.gamma = ptr_or_null(w);
  a.device = x.device();
  return a;
}

}  // namespace

BatchNormOutput batch_norm_forward(const Array& x_in, const Array& weight, const Array& bias, const Array& running_mean,
                                   const Array& running_var, const BatchNormOptions& o, const Array& residual) {
  const std::string& op = o.op;
  check_features(op, "input", x_in);
  check_vector(op, "weight", weight, x_in, false);
  check_vector(op, "bias", bias, x_in, false);
  check_vector(op, "running_mean", running_mean, x_in, true);
  check_vector(op, "running_var", running_var, x_in, true);
  check_options(o);
  if (residual.defined()) check_like_input(op, "residual", residual, x_in);
  const std::int64_t n = x_in.dim(0), c = x_in.dim(1);
  if (o.training && n == 1)
    throw_value_error(op, "input", "more than 1 row per channel when training", std::to_string(n));
  if (!o.training && (!running_mean.defined() || !running_var.defined()))
    throw_value_error(op, running_mean.defined() ? "running_var" : "running_mean",
                      "running statistics in eval mode (training=False)", "nothing");
  if (running_mean.defined() != running_var.defined())
    throw_value_error(op, running_mean.defined() ? "running_var" : "running_mean",
                      "both running statistics or neither", "only one");
  const backend::BatchNormKernels& k =
      kernels_for(problem_of(x_in, BatchNormPass::forward, o, residual.defined()), o.policy);
  const Array x = packed(x_in);
  const Array r = residual.defined() ? packed(residual) : Array{};
  const Dtype acc = accum_dtype(x.dtype());
  const Array w = weight.defined() ? weight.contiguous() : Array{};
  const Array b = bias.defined() ? bias.contiguous() : Array{};
  BatchNormOutput out;
  out.y = Array::empty({n, c}, x.dtype(), x.device());
  out.mean = Array::empty({c}, acc, x.device());
  out.invstd = Array::empty({c}, acc, x.device());
  backend::BatchNormArgs a = base_args(x, w, o);
  a.beta = ptr_or_null(b);
  a.residual = ptr_or_null(r);
  // Training on no rows: nothing to learn from, the running statistics stay (as torch's).
  const bool update = !(o.training && n == 0);
  a.running_mean = update && running_mean.defined() ? running_mean.raw_data() : nullptr;
  a.running_var = update && running_var.defined() ? running_var.raw_data() : nullptr;
  a.y = out.y.raw_data();
  a.mean = out.mean.raw_data();
  a.invstd = out.invstd.raw_data();
  k.forward(a);
  return out;
}

BatchNormGrads batch_norm_backward(const Array& dy_in, const Array& x_in, const Array& y_in, const Array& weight,
                                   const Array& mean, const Array& invstd, bool need_input, bool need_params,
                                   const BatchNormOptions& o, bool need_residual) {
  const std::string& op = o.op;
  check_features(op, "input", x_in);
  check_like_input(op, "grad_out", dy_in, x_in);
  if (o.relu) {
    if (!y_in.defined()) throw_value_error(op, "output", "the forward's output (relu=True)", "nothing");
    check_features(op, "output", y_in);
    if (y_in.dtype() != x_in.dtype() || y_in.shape() != x_in.shape() || y_in.device() != x_in.device())
      throw_value_error(op, "output", "the forward's output: " + std::string(to_string(x_in.dtype())) + " " +
                                          shape_of(x_in) + " on " + to_string(x_in.device()),
                        std::string(to_string(y_in.dtype())) + " " + shape_of(y_in) + " on " +
                            to_string(y_in.device()));
  }
  check_vector(op, "weight", weight, x_in, false);
  for (const auto& [what, v] : {std::pair<const char*, const Array*>{"mean", &mean}, {"invstd", &invstd}}) {
    if (!v->defined()) throw_value_error(op, what, "the forward's saved statistics", "nothing");
    check_vector(op, what, *v, x_in, false);
  }
  BatchNormGrads g;
  if (need_residual && !o.relu) {  // the residual's gradient is dy itself
    g.dresidual = dy_in;
    need_residual = false;
  }
  if (!need_input && !need_params && !need_residual) return g;
  const backend::BatchNormKernels& k =
      kernels_for(problem_of(x_in, BatchNormPass::backward, o, need_residual), o.policy);
  const std::int64_t n = x_in.dim(0), c = x_in.dim(1);
  const Dtype acc = accum_dtype(x_in.dtype());
  const Array x = packed(x_in);
  const Array dy = packed(dy_in);
  const Array y = o.relu ? packed(y_in) : Array{};
  const Array w = weight.defined() ? weight.contiguous() : Array{};
  const Array m = mean.contiguous();
  const Array is = invstd.contiguous();
  backend::BatchNormArgs a = base_args(x, w, o);
  a.mean = m.raw_data();
  a.invstd = is.raw_data();
  a.y_saved = ptr_or_null(y);
  a.dy = dy.raw_data();
  if (need_input) {
    g.dx = Array::empty({n, c}, x.dtype(), x.device());
    a.dx = g.dx.raw_data();
  }
  if (need_params) {
    g.dweight = Array::empty({c}, acc, x.device());
    g.dbias = Array::empty({c}, acc, x.device());
    a.dgamma = g.dweight.raw_data();
    a.dbeta = g.dbias.raw_data();
  }
  if (need_residual) {
    g.dresidual = Array::empty({n, c}, x.dtype(), x.device());
    a.dresidual = g.dresidual.raw_data();
  }
  k.backward(a);
  return g;
}

Explanation explain_batch_norm(const Array& x, BatchNormPass pass, const BatchNormOptions& o) {
  check_features(o.op, "input", x);
  return explain(problem_of(x, pass, o), backend::device_caps(), effective_policy(o.policy, kFamily));
}

}  // namespace lattice::ops
