// Semantic layer of the convolution family: validates arguments, builds or fetches relations,
// fills a ConvProblem, asks the route layer, and calls the chosen kernel from the kernel table.
#include "lattice/ops/conv.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "backend/kernel_table.h"
#include "lattice/core/error.h"
#include "lattice/route/tuning.h"
#include "ops/common.h"

namespace lattice::ops {

namespace {

// Checked weight: the canonical (K, C_in, C_out) contiguous copy/view plus the caller's layout.
struct CheckedWeight {
  Array kernel_major;
  WeightLayout layout = WeightLayout::kernel_major;
  std::int64_t c_out = 0;
};

// `any_dtype`: the weight may have another float dtype than feats (conv_compute_weight converts it).
CheckedWeight check_weight(const ConvPlan& plan, const Array& feats, const Array& weight, bool any_dtype = false) {
  const std::string_view op = plan.op;
  const Int3& k = plan.spec.size;
  const std::int64_t kv = plan.spec.volume();
  if (!feats.defined()) throw_value_error(op, "feats", "an (N, C_in) float array", "nothing");
  if (!is_floating(feats.dtype()))
    throw_type_error(op, "feats", "float16, bfloat16, float32 or float64", to_string(feats.dtype()));
  if (feats.ndim() != 2 || feats.dim(0) != plan.relation->n_in)
    throw_value_error(op, "feats", "shape (N_in=" + std::to_string(plan.relation->n_in) + ", C_in)",
                      format_shape(feats.shape()));
  const std::int64_t c_in = feats.dim(1);
  if (feats.device() != plan.input->coords().device())
    throw_value_error(op, "feats",
                      "a tensor on " + to_string(plan.input->coords().device()) + " (the device of coords)",
                      to_string(feats.device()));
  if (!weight.defined()) throw_value_error(op, "weight", "a weight array", "nothing");
  if (any_dtype ? !is_floating(weight.dtype()) : weight.dtype() != feats.dtype())
    throw_type_error(op, "weight",
                     any_dtype ? std::string("a float dtype") : std::string(to_string(feats.dtype())) + " (the dtype of feats)",
                     to_string(weight.dtype()));
  if (weight.device() != feats.device())
    throw_value_error(op, "weight", "a tensor on " + to_string(feats.device()) + " (the device of feats)",
                      to_string(weight.device()));
  const std::string expected = "(C_out, " + std::to_string(k[0]) + ", " + std::to_string(k[1]) + ", " +
                               std::to_string(k[2]) + ", C_in=" + std::to_string(c_in) + ") or (" +
                               std::to_string(kv) + ", C_in=" + std::to_string(c_in) + ", C_out)";
  // any_dtype: contiguous_as converts among f16 / bf16 / f32 and between f32 and f64 only
  if (any_dtype && weight.dtype() != feats.dtype() && (size_of(weight.dtype()) == 2 || size_of(feats.dtype()) == 2) &&
      (weight.dtype() == Dtype::f64 || feats.dtype() == Dtype::f64))
    throw_type_error(op, "weight",
                     std::string("float16, bfloat16 or float32 for ") + std::string(to_string(feats.dtype())) +
                         " features",
                     to_string(weight.dtype()));
  CheckedWeight out;
  if (weight.ndim() == 5) {
    if (weight.dim(1) != k[0] || weight.dim(2) != k[1] || weight.dim(3) != k[2] || weight.dim(4) != c_in)
      throw_value_error(op, "weight", expected, format_shape(weight.shape()));
    out.layout = WeightLayout::dense;
    out.c_out = weight.dim(0);
    // dense (co, k, ci) is at (co * K + k) * C_in + ci: as (K, C_in, C_out), strides (C_in, 1, K * C_in)
    const Array w = weight.contiguous();
    out.kernel_major = w.strided_view({kv, c_in, out.c_out}, {c_in, 1, kv * c_in}).contiguous_as(feats.dtype());
  } else if (weight.ndim() == 3) {
    if (weight.dim(0) != kv || weight.dim(1) != c_in)
      throw_value_error(op, "weight", expected, format_shape(weight.shape()));
    out.layout = WeightLayout::kernel_major;
    out.c_out = weight.dim(2);
    out.kernel_major = weight.contiguous_as(feats.dtype());
  } else {
    throw_value_error(op, "weight", expected, format_shape(weight.shape()));
  }
  return out;
}

ConvProblem make_problem(const ConvPlan& plan, const Array& feats, std::int64_t c_out, ConvPass pass) {
  ConvProblem p;
  p.op = plan.op;
  p.relation = plan.kind;
  p.pass = pass;
  p.dtype = feats.dtype();
  p.device = feats.device();
  p.n_in = plan.relation->n_in;
  p.n_out = plan.relation->n_out;
  p.c_in = feats.dim(1);
  p.c_out = c_out;
  p.kernel_volume = plan.relation->kernel_volume;
  // Known from the geometry or an earlier pass, else -1: counting here would read back on a
  // device (no route's admission depends on it; explain_conv counts).
  p.n_edges = plan.relation->known_edges();
  p.identity_relation = plan.relation->identity;
  p.deterministic = plan.options.deterministic;
  p.allow_tf32 = plan.options.allow_tf32;
  return p;
}

// The route for `problem` and its kernels.
struct Chosen {
  RouteId id;
  const backend::ConvKernels& kernels;
};
Chosen choose(const ConvPlan& plan, const ConvProblem& problem) {
  const RouteId id = decide_or_throw(problem, backend::device_caps(), effective_policy(plan.options.policy, "conv"));
  const backend::ConvKernels* k = backend::find_conv_kernels(id);
  LATTICE_ASSERT(k != nullptr, "admitted conv route has no kernels in this build");
  return {id, *k};
}

// The relation views `route` reads in `pass` (only those are built).
backend::RelationView view_for(const ConvPlan& plan, RouteId route, ConvPass pass) {
  return relation_view(*plan.relation, conv_relation_reads(route, pass));
}

std::atomic<bool> g_tuning{false};
std::atomic<int> g_tuning_reps{5};

// Waits for the device work that wrote `a` (a one-element read-back; nothing to wait for on the CPU).
void wait_for(const Array& a) {
  if (a.device().is_cpu() || a.numel() == 0) return;
  (void)a.strided_view({1}, {1}).to(Device::cpu());
}

// The kernel of one pass in a route's table entry.
backend::ConvFn pass_kernel(const backend::ConvKernels& k, ConvPass pass) {
  switch (pass) {
    case ConvPass::forward: return k.forward;
    case ConvPass::input_grad: return k.input_grad;
    case ConvPass::weight_grad: return k.weight_grad;
  }
  return nullptr;
}

// Runs route `id`'s kernel of `problem.pass` with `args` (the relation views it reads filled in).
void run_route(const ConvPlan& plan, const ConvProblem& problem, RouteId id, const backend::ConvKernels& k,
               backend::ConvArgs& args) {
  const backend::ConvFn fn = pass_kernel(k, problem.pass);
  LATTICE_ASSERT(fn != nullptr, "admitted conv route has no kernel for this pass");
  args.rel = view_for(plan, id, problem.pass);
  fn(args);
}

// The tuning step of one pass (set_conv_tuning): times the route layer's candidates writing `out`
// and records the route layer's choice among them, unless the problem's bucket has a choice already, the policy forces
// a route, or tuning is off.
void tune_pass(const ConvPlan& plan, const ConvProblem& problem, const Array& out, backend::ConvArgs& args) {
  if (!g_tuning.load(std::memory_order_relaxed)) return;
  const RoutePolicy policy = effective_policy(plan.options.policy, "conv");
  if (policy.force || !policy.use_tuned) return;
  const DeviceCaps& caps = backend::device_caps();
  const std::string key = conv_tuning_key(problem, caps);
  if (find_tuned(key)) return;
  const int reps = std::max(1, g_tuning_reps.load(std::memory_order_relaxed));
  RoutePolicy by_rank;
  by_rank.use_tuned = false;
  std::vector<TunedTime> times;
  for (const RouteId id : tuning_candidates(explain(problem, caps, by_rank))) {  // the route layer's list
    const backend::ConvKernels* k = backend::find_conv_kernels(id);
    if (k == nullptr) continue;
    TunedTime t{id, -1.0, {}};
    try {
      run_route(plan, problem, id, *k, args);  // warm-up: also builds the views this route reads
      wait_for(out);
      std::vector<double> ms;
      for (int i = 0; i < reps; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        run_route(plan, problem, id, *k, args);
        wait_for(out);
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
      std::sort(ms.begin(), ms.end());
      t.ms = ms[ms.size() / 2];
    } catch (const std::exception& ex) {
      t.error = ex.what();
    }
    times.push_back(std::move(t));
  }
  if (std::optional<TunedChoice> choice = tuned_choice(std::move(times))) set_tuned(key, std::move(*choice));  // the route layer's rule
}

// One pass of the call into `out` (args filled but for the relation views): tuned first when
// tuning is on, then the chosen route.
void run_pass(const ConvPlan& plan, const ConvProblem& problem, const Array& out, backend::ConvArgs& args) {
  tune_pass(plan, problem, out, args);
  const Chosen chosen = choose(plan, problem);
  run_route(plan, problem, chosen.id, chosen.kernels, args);
}
}  // namespace

ConvPlan plan_conv(std::string_view op, RelationKind kind, const SparseTensor& x,
                   const ConvOptions& options, const SparseTensor* target) {
  return plan_conv(op, kind, x.coordinate_set(), options,
                   target ? target->coordinate_set() : std::shared_ptr<CoordinateSet>{});
}

ConvPlan plan_conv(std::string_view op, RelationKind kind, const std::shared_ptr<CoordinateSet>& x,
                   const ConvOptions& options, const std::shared_ptr<CoordinateSet>& target) {
  const KernelSpec requested{.size = options.kernel_size,
                             .stride = options.stride,
                             .padding = options.padding,
                             .dilation = options.dilation,
                             .expand = options.expand};
  PlannedRelation planned = plan_relation(op, kind, x, requested, target);
  ConvPlan plan;
  plan.op = std::string(op);
  plan.kind = kind;
  plan.options = options;
  plan.spec = planned.spec;
  plan.relation = std::move(planned.relation);
  plan.input = x;
  plan.output = std::move(planned.output);
  return plan;
}

Array conv_forward(const ConvPlan& plan, const Array& feats, const Array& weight, const Array* bias) {
  const CheckedWeight w = check_weight(plan, feats, weight);
  const Array x = feats.contiguous();
  Array b;
  if (bias && bias->defined()) {
    if (bias->dtype() != feats.dtype())
      throw_type_error(plan.op, "bias", std::string(to_string(feats.dtype())) + " (the dtype of feats)",
                       to_string(bias->dtype()));
    if (bias->ndim() != 1 || bias->dim(0) != w.c_out)
      throw_value_error(plan.op, "bias", "shape (C_out=" + std::to_string(w.c_out) + ",)",
                        format_shape(bias->shape()));
    if (bias->device() != feats.device())
      throw_value_error(plan.op, "bias", "a tensor on " + to_string(feats.device()) + " (the device of feats)",
                        to_string(bias->device()));
    b = bias->contiguous();
  }
  const ConvProblem problem = make_problem(plan, x, w.c_out, ConvPass::forward);
  Array y = Array::empty({plan.relation->n_out, w.c_out}, x.dtype(), x.device());
  backend::ConvArgs args;
  args.dtype = x.dtype();
  args.c_in = x.dim(1);
  args.c_out = w.c_out;
  args.x = x.raw_data();
  args.w = w.kernel_major.raw_data();
  args.bias = b.defined() ? b.raw_data() : nullptr;
  args.y = y.raw_data();
  args.device = x.device();
  args.allow_tf32 = plan.options.allow_tf32;
  run_pass(plan, problem, y, args);
  return y;
}

ConvGrads conv_backward(const ConvPlan& plan, const Array& feats, const Array& weight,
                        const Array& grad_out, ConvGradRequest request) {
  const CheckedWeight w = check_weight(plan, feats, weight);
  const Array x = feats.contiguous();
  if (!grad_out.defined() || grad_out.dtype() != x.dtype())
    throw_type_error(plan.op, "grad_out", std::string(to_string(x.dtype())) + " (the dtype of feats)",
                     grad_out.defined() ? to_string(grad_out.dtype()) : "nothing");
  if (grad_out.ndim() != 2 || grad_out.dim(0) != plan.relation->n_out || grad_out.dim(1) != w.c_out)
    throw_value_error(plan.op, "grad_out",
                      "shape (N_out=" + std::to_string(plan.relation->n_out) + ", C_out=" +
                          std::to_string(w.c_out) + ")",
                      format_shape(grad_out.shape()));
  if (grad_out.device() != x.device())
    throw_value_error(plan.op, "grad_out", "a tensor on " + to_string(x.device()) + " (the device of feats)",
                      to_string(grad_out.device()));
  const Array dy = grad_out.contiguous();
  backend::ConvArgs args;
  args.dtype = x.dtype();
  args.c_in = x.dim(1);
  args.c_out = w.c_out;
  args.x = x.raw_data();
  args.w = w.kernel_major.raw_data();
  args.dy = dy.raw_data();
  args.device = x.device();
  args.allow_tf32 = plan.options.allow_tf32;
  ConvGrads grads;
  if (request.input) {
    const ConvProblem problem = make_problem(plan, x, w.c_out, ConvPass::input_grad);
    grads.input = Array::empty({plan.relation->n_in, x.dim(1)}, x.dtype(), x.device());
    args.dx = grads.input.raw_data();
    run_pass(plan, problem, grads.input, args);
  }
  if (request.weight) {
    const ConvProblem problem = make_problem(plan, x, w.c_out, ConvPass::weight_grad);
    Array dw = Array::empty({plan.relation->kernel_volume, x.dim(1), w.c_out}, x.dtype(), x.device());
    args.dw = dw.raw_data();
    run_pass(plan, problem, dw, args);
    const WeightGradForm form = request.weight_as.value_or(WeightGradForm{w.layout, weight.dtype()});
    if (!is_floating(form.dtype) ||
        (form.dtype != x.dtype() && form.dtype == Dtype::f64 && size_of(x.dtype()) == 2))
      throw_type_error(plan.op, "weight_grad_dtype",
                       std::string("a float dtype (float64 only for float32 or float64 features)"),
                       std::string(to_string(form.dtype)) + " for " + std::string(to_string(x.dtype())) + " features");
    if (form.layout == WeightLayout::dense) {
      // kernel-major (k, ci, co) is at (k * C_in + ci) * C_out + co: as (C_out, K, C_in), strides
      // (1, C_in * C_out, C_out); one pass that permutes and converts
      const Int3 ks = plan.spec.size;
      const std::int64_t ci = x.dim(1), co = w.c_out, kv = plan.relation->kernel_volume;
      grads.weight = dw.strided_view({co, kv, ci}, {1, ci * co, co})
                         .contiguous_as(form.dtype)
                         .reshape({co, ks[0], ks[1], ks[2], ci});
    } else {
      grads.weight = dw.contiguous_as(form.dtype);
    }
  }
  if (request.bias) {
    // The weight-gradient route sums dy's columns on its device (every route has a bias kernel).
    const Chosen chosen = choose(plan, make_problem(plan, x, w.c_out, ConvPass::weight_grad));
    LATTICE_ASSERT(chosen.kernels.bias_grad != nullptr, "admitted conv route has no bias_grad kernel");
    grads.bias = Array::empty({w.c_out}, x.dtype(), x.device());
    args.rel = relation_view(*plan.relation, 0);  // bias gradients read n_out alone
    args.dbias = grads.bias.raw_data();
    chosen.kernels.bias_grad(args);
  }
  return grads;
}

void set_conv_tuning(bool enabled, int reps) {
  if (reps < 1) throw_value_error("set_conv_tuning", "reps", "a positive repeat count", std::to_string(reps));
  g_tuning_reps.store(reps, std::memory_order_relaxed);
  g_tuning.store(enabled, std::memory_order_relaxed);
}

bool conv_tuning_enabled() { return g_tuning.load(std::memory_order_relaxed); }

Array conv_compute_weight(const ConvPlan& plan, const Array& feats, const Array& weight) {
  return check_weight(plan, feats, weight, /*any_dtype=*/true).kernel_major;
}

// The explanations count the relation's edges (one read-back for an uncounted device relation):
// they are for people, off the hot path.
Explanation explain_float_conv(const ConvPlan& plan, const Array& feats, std::int64_t c_out, ConvPass pass) {
  ConvProblem p = make_problem(plan, feats, c_out, pass);
  p.n_edges = plan.relation->n_edges();
  return explain(p, backend::device_caps(), effective_policy(plan.options.policy, "conv"));
}

Explanation explain_relation(const ConvPlan& plan) {
  Explanation e = explain(relation_problem(*plan.input, plan.kind, plan.relation->kernel_volume, plan.op),
                          backend::device_caps());
  if (plan.relation->transposed)
    e.problem += "; reused: the transpose of the cached relation between these coordinate sets (its edges "
                 "transposed by the chosen route, nothing hashed)";
  return e;
}

Explanation explain_conv(const ConvPlan& plan, const Array& feats, const Array& weight, ConvPass pass) {
  const CheckedWeight w = check_weight(plan, feats, weight);
  ConvProblem p = make_problem(plan, feats, w.c_out, pass);
  p.n_edges = plan.relation->n_edges();
  Explanation e = explain(p, backend::device_caps(), effective_policy(plan.options.policy, "conv"));
  e.prior.push_back(explain_relation(plan));
  return e;
}

SparseTensor conv3d(const SparseTensor& x, const Array& weight, const ConvOptions& options,
                    const Array* bias, const SparseTensor* target) {
  const ConvPlan plan =
      plan_conv("conv3d", target ? RelationKind::target : RelationKind::forward, x, options, target);
  return SparseTensor(plan.output, conv_forward(plan, x.feats(), weight, bias));
}

SparseTensor subm_conv3d(const SparseTensor& x, const Array& weight, const ConvOptions& options,
                         const Array* bias) {
  const ConvPlan plan = plan_conv("subm_conv3d", RelationKind::submanifold, x, options);
  return SparseTensor(plan.output, conv_forward(plan, x.feats(), weight, bias));
}

SparseTensor conv_transpose3d(const SparseTensor& x, const Array& weight, const ConvOptions& options,
                              const Array* bias, const SparseTensor* target) {
  const ConvPlan plan = plan_conv("conv_transpose3d",
                                  target ? RelationKind::transposed_target : RelationKind::transposed, x,
                                  options, target);
  return SparseTensor(plan.output, conv_forward(plan, x.feats(), weight, bias));
}

SparseTensor generative_conv_transpose3d(const SparseTensor& x, const Array& weight,
                                         const ConvOptions& options, const Array* bias) {
  const ConvPlan plan = plan_conv("generative_conv_transpose3d", RelationKind::generative, x, options);
  return SparseTensor(plan.output, conv_forward(plan, x.feats(), weight, bias));
}

// ---- weight layouts ----------------------------------------------------------------------------
// Each conversion is a permutation of the axes: a strided view of the contiguous weight, gathered
// by Array::contiguous() (on the CPU by the host, on a device by its allocator's strided copy,
// so device weights never pass through the host).

Array weight_dense_to_kernel_major(const Array& weight) {
  if (weight.ndim() != 5)
    throw_value_error("weight_dense_to_kernel_major", "weight", "(C_out, Kx, Ky, Kz, C_in)",
                      format_shape(weight.shape()));
  const Array w = weight.contiguous();
  // dense (co, k, ci) is at (co * K + k) * C_in + ci: as (K, C_in, C_out), strides (C_in, 1, K * C_in)
  const std::int64_t co = w.dim(0), kv = w.dim(1) * w.dim(2) * w.dim(3), ci = w.dim(4);
  return w.strided_view({kv, ci, co}, {ci, 1, kv * ci}).contiguous();
}

Array weight_kernel_major_to_dense(const Array& weight, Int3 kernel_size) {
  const std::int64_t kv = static_cast<std::int64_t>(kernel_size[0]) * kernel_size[1] * kernel_size[2];
  if (weight.ndim() != 3 || weight.dim(0) != kv)
    throw_value_error("weight_kernel_major_to_dense", "weight",
                      "(K=" + std::to_string(kv) + ", C_in, C_out)", format_shape(weight.shape()));
  const Array w = weight.contiguous();
  // kernel-major (k, ci, co) is at (k * C_in + ci) * C_out + co: as (C_out, K, C_in), strides
  // (1, C_in * C_out, C_out)
  const std::int64_t ci = w.dim(1), co = w.dim(2);
  return w.strided_view({co, kv, ci}, {1, ci * co, co})
      .contiguous()
      .reshape({co, kernel_size[0], kernel_size[1], kernel_size[2], ci});
}

Array weight_spconv_to_dense(const Array& weight) {
  if (weight.ndim() != 5)
    throw_value_error("weight_spconv_to_dense", "weight", "(Kx, Ky, Kz, C_out, C_in)",
                      format_shape(weight.shape()));
  const Array w = weight.contiguous();
  // spconv (k, co, ci) is at (k * C_out + co) * C_in + ci: as (C_out, K, C_in), strides
  // (C_in, C_out * C_in, 1)
  const std::int64_t kv = w.dim(0) * w.dim(1) * w.dim(2), co = w.dim(3), ci = w.dim(4);
  return w.strided_view({co, kv, ci}, {ci, co * ci, 1}).contiguous().reshape({co, w.dim(0), w.dim(1), w.dim(2), ci});
}

}  // namespace lattice::ops
