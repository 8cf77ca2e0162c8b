// Semantic layer of the pooling family: validates arguments, builds the edges of each pooling
// (a cached relation, the rows of each batch, or the trilinear neighbours), fills a PoolProblem,
// asks the route layer and calls the chosen kernel from the kernel table.
#include "lattice/ops/pool.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "backend/common/geometry.h"
#include "backend/kernel_table.h"
#include "lattice/core/error.h"
#include "ops/common.h"
#include "tensor/coord_index.h"

namespace lattice::ops {

namespace {

void check_input(std::string_view op, const std::shared_ptr<CoordinateSet>& x) {
  if (!x) throw_value_error(op, "input", "a SparseTensor", "an empty SparseTensor");
}

// The edge builders of the pool_edges route chosen for `pass` on `device` (UnsupportedError when
// this build has none for that device).
const backend::PoolEdgeKernels& edge_kernels(std::string_view op, PoolEdgesPass pass, Device device,
                                             std::int64_t n_rows) {
  PoolEdgesProblem problem;
  problem.op = std::string(op);
  problem.pass = pass;
  problem.device = device;
  problem.n_rows = n_rows;
  const std::optional<RouteId> route =
      select(problem, backend::device_caps(), RoutePolicy{});
  const backend::PoolEdgeKernels* k = route ? backend::find_pool_edge_kernels(*route) : nullptr;
  if (!k)
    throw UnsupportedError("[" + std::string(op) + "] coords: expected coordinates on a device " +
                           "this build supports, got " + to_string(device));
  return *k;
}

// Stores an edge list built by a pool_edges route into the plan.
void set_device_edges(PoolPlan& plan, backend::PoolEdgeList&& edges) {
  plan.n_out = edges.out_ptr.dim(0) - 1;
  plan.n_edges = edges.in_idx.dim(0);
  plan.out_ptr = std::move(edges.out_ptr);
  plan.in_idx = std::move(edges.in_idx);
  if (edges.weights.defined()) plan.weights = std::move(edges.weights);
}

PoolPlan plan_over_relation(std::string_view op, PoolMode mode, PoolEdges edges, RelationKind kind,
                            const std::shared_ptr<CoordinateSet>& x, const PoolOptions& o,
                            const std::shared_ptr<CoordinateSet>& target) {
  const KernelSpec requested{.size = o.kernel_size,
                             .stride = o.stride,
                             .padding = o.padding,
                             .dilation = o.dilation,
                             .expand = o.expand};
  PlannedRelation planned = plan_relation(op, kind, x, requested, target);
  PoolPlan plan;
  plan.op = std::string(op);
  plan.mode = mode;
  plan.edges = edges;
  plan.spec = planned.spec;
  plan.deterministic = o.deterministic;
  plan.policy = o.policy;
  plan.n_in = planned.relation->n_in;
  plan.n_out = planned.relation->n_out;
  plan.n_edges = planned.relation->n_edges();
  plan.out_ptr = planned.relation->out_ptr();
  plan.in_idx = planned.relation->in_idx();
  plan.relation = std::move(planned.relation);
  plan.input = x;
  plan.output = std::move(planned.output);
  return plan;
}

PoolPlan plan_base(std::string_view op, PoolMode mode, PoolEdges edges,
                   const std::shared_ptr<CoordinateSet>& x, const PoolOptions& o) {
  PoolPlan plan;
  plan.op = std::string(op);
  plan.mode = mode;
  plan.edges = edges;
  plan.deterministic = o.deterministic;
  plan.policy = o.policy;
  plan.n_in = x->size();
  plan.input = x;
  return plan;
}

PoolProblem make_problem(const PoolPlan& plan, const Array& features, PoolPass pass) {
  PoolProblem p;
  p.op = plan.op;
  p.mode = plan.mode;
  p.pass = pass;
  p.edges = plan.edges;
  p.dtype = features.dtype();
  p.device = features.device();
  p.n_in = plan.n_in;
  p.n_out = plan.n_out;
  p.channels = features.ndim() == 2 ? features.dim(1) : 0;
  p.n_edges = plan.n_edges;
  p.spec = plan.spec;
  p.deterministic = plan.deterministic;
  return p;
}

const backend::PoolKernels& choose(const PoolPlan& plan, const PoolProblem& problem) {
  const backend::PoolKernels* k = backend::find_pool_kernels(
      decide_or_throw(problem, backend::device_caps(), effective_policy(plan.policy, "pool")));
  LATTICE_ASSERT(k != nullptr, "admitted pool route has no kernels in this build");
  return *k;
}

// A float (rows, C) array on the coordinates' device; `rows_name` names the expected row count.
void check_features(const PoolPlan& plan, const Array& a, std::string_view arg, std::int64_t rows,
                    std::string_view rows_name) {
  const std::string_view op = plan.op;
  if (!a.defined())
    throw_value_error(op, arg, "an (" + std::string(rows_name) + ", C) float array", "nothing");
  if (!is_floating(a.dtype()))
    throw_type_error(op, arg, "float16, bfloat16, float32 or float64", to_string(a.dtype()));
  if (a.ndim() != 2 || a.dim(0) != rows)
    throw_value_error(op, arg,
                      "shape (" + std::string(rows_name) + "=" + std::to_string(rows) + ", C)",
                      format_shape(a.shape()));
  if (a.device() != plan.input->coords().device())
    throw_value_error(op, arg, "a tensor on " + to_string(plan.input->coords().device()),
                      to_string(a.device()));
}

backend::PoolArgs make_args(const PoolPlan& plan, Dtype dtype, std::int64_t channels) {
  backend::PoolArgs args;
  args.dtype = dtype;
  args.mode = plan.mode;
  args.n_in = plan.n_in;
  args.n_out = plan.n_out;
  args.channels = channels;
  args.n_edges = plan.n_edges;
  args.out_ptr = plan.out_ptr.data<std::int64_t>();
  args.in_idx = plan.in_idx.data<std::int32_t>();
  args.weights = plan.weights.defined() ? plan.weights.data<double>() : nullptr;
  args.device = plan.input->coords().device();
  return args;
}

}  // namespace

PoolPlan plan_pool(std::string_view op, PoolMode mode, const std::shared_ptr<CoordinateSet>& x,
                   const PoolOptions& options, const std::shared_ptr<CoordinateSet>& target) {
  LATTICE_ASSERT(mode != PoolMode::weighted, "local pooling takes sum, avg or max");
  return plan_over_relation(op, mode, target ? PoolEdges::target : PoolEdges::forward,
                            target ? RelationKind::target : RelationKind::forward, x, options,
                            target);
}

PoolPlan plan_pool_transpose(std::string_view op, const std::shared_ptr<CoordinateSet>& x,
                             const PoolOptions& options,
                             const std::shared_ptr<CoordinateSet>& target) {
  return plan_over_relation(
      op, PoolMode::avg, target ? PoolEdges::transposed_target : PoolEdges::transposed,
      target ? RelationKind::transposed_target : RelationKind::transposed, x, options, target);
}

PoolPlan plan_global_pool(std::string_view op, PoolMode mode,
                          const std::shared_ptr<CoordinateSet>& x, const PoolOptions& options) {
  LATTICE_ASSERT(mode != PoolMode::weighted, "global pooling takes sum, avg or max");
  check_input(op, x);
  // Rows must be unique (SEMANTICS.md): a repeated site would be counted twice in its batch's sum
  // (and mean) without any sign. Building the coordinate index is the O(N) hash check that names
  // the first repeated row; it is cached on the set, so a tensor a convolution has seen pays nothing.
  (void)x->index(op);
  PoolPlan plan = plan_base(op, mode, PoolEdges::batch, x, options);
  const std::int64_t n = x->size();
  {
    backend::BatchEdgesArgs a;
    a.n = n;
    a.coords = x->coords().data<std::int32_t>();
    a.batches =
        x->batch_counts() ? static_cast<std::int64_t>(x->batch_counts()->size()) : std::int64_t{-1};
    a.device = x->coords().device();
    backend::PoolEdgeList edges = edge_kernels(op, PoolEdgesPass::batch, a.device, n).batch_edges(a);
    if (edges.negative_row >= 0)
      throw_value_error(op, "coords", "batch ids >= 0",
                        "batch id " + std::to_string(edges.negative_batch) + " at row " +
                            std::to_string(edges.negative_row));
    const std::int64_t batches = edges.out_ptr.dim(0) - 1;
    if (mode == PoolMode::max && edges.first_empty >= 0)
      throw_value_error(
          op, "input", "at least one row in every batch (the max of an empty batch is undefined)",
          "no rows in batch " + std::to_string(edges.first_empty) + " of " + std::to_string(batches));
    set_device_edges(plan, std::move(edges));
    return plan;
  }
}

PoolPlan plan_trilinear_upsample(std::string_view op, const std::shared_ptr<CoordinateSet>& x,
                                 std::optional<Int3> stride,
                                 const std::shared_ptr<CoordinateSet>& target,
                                 const PoolOptions& options) {
  check_input(op, x);
  const Int3 coarse = x->stride();
  std::shared_ptr<CoordinateSet> fine;
  Int3 ratio{};
  if (target) {
    if (target->coords().device() != x->coords().device())
      throw_value_error(op, "coordinates",
                        "the device of the input (" + to_string(x->coords().device()) + ")",
                        to_string(target->coords().device()));
    const Int3 fs = target->stride();
    for (int a = 0; a < 3; ++a) {
      if (coarse[a] % fs[a] != 0)
        throw_value_error(op, "coordinates",
                          "a tensor stride dividing the input stride " + to_string(coarse),
                          "stride " + to_string(fs));
      ratio[a] = coarse[a] / fs[a];
    }
    if (stride && *stride != ratio)
      throw_value_error(op, "stride",
                        to_string(ratio) + " (input stride " + to_string(coarse) +
                            " / coordinates stride " + to_string(fs) + ") or None",
                        to_string(*stride));
    fine = target;
  } else {
    ratio = stride.value_or(Int3{2, 2, 2});
    if (ratio[0] < 1 || ratio[1] < 1 || ratio[2] < 1)
      throw_value_error(op, "stride", "strides >= 1", to_string(ratio));
    const KernelSpec children{.size = ratio, .stride = ratio};
    fine = plan_relation(op, RelationKind::generative, x, children, nullptr).output;
  }

  PoolPlan plan = plan_base(op, PoolMode::weighted, PoolEdges::trilinear, x, options);
  plan.output = fine;
  const CoordIndex& index = x->index(op);
  backend::TrilinearEdgesArgs a;
  a.n_coarse = x->size();
  a.n_fine = fine->size();
  a.coarse = x->coords().data<std::int32_t>();
  a.fine = fine->coords().data<std::int32_t>();
  if (const backend::DeviceCoordTable& t = index.table(); t.slots.defined()) {  // the coarse set's index
    a.coarse_slots = t.slots.data<std::int32_t>();
    a.coarse_mask = t.mask;
  }
  a.ratio = ratio;
  a.device = x->coords().device();
  set_device_edges(plan, edge_kernels(op, PoolEdgesPass::trilinear, a.device, a.n_fine).trilinear_edges(a));
  return plan;
}

PoolOutput pool_forward(const PoolPlan& plan, const Array& feats) {
  check_features(plan, feats, "feats", plan.n_in, "N_in");
  const Array x = feats.contiguous();
  const backend::PoolKernels& k = choose(plan, make_problem(plan, x, PoolPass::forward));
  LATTICE_ASSERT(k.forward != nullptr, "admitted pool route has no forward kernel");
  const std::int64_t c = x.dim(1);
  PoolOutput out;
  out.out = Array::empty({plan.n_out, c}, x.dtype(), x.device());
  if (plan.mode == PoolMode::max)
    out.argmax = Array::empty({plan.n_out, c}, Dtype::i32, x.device());
  backend::PoolArgs args = make_args(plan, x.dtype(), c);
  args.x = x.raw_data();
  args.y = out.out.raw_data();
  args.argmax = out.argmax.defined() ? out.argmax.data<std::int32_t>() : nullptr;
  k.forward(args);
  return out;
}

Array pool_backward(const PoolPlan& plan, const Array& grad_out, const Array* argmax) {
  check_features(plan, grad_out, "grad_out", plan.n_out, "N_out");
  const Array dy = grad_out.contiguous();
  const std::int64_t c = dy.dim(1);
  Array am;
  if (plan.mode == PoolMode::max) {
    if (!argmax || !argmax->defined() || argmax->dtype() != Dtype::i32 || argmax->ndim() != 2 ||
        argmax->dim(0) != plan.n_out || argmax->dim(1) != c || argmax->device() != dy.device())
      throw_value_error(plan.op, "argmax",
                        "the forward's int32 (N_out=" + std::to_string(plan.n_out) +
                            ", C=" + std::to_string(c) + ") argmax on the device of grad_out",
                        argmax && argmax->defined() ? std::string(to_string(argmax->dtype())) +
                                                          " " + format_shape(argmax->shape())
                                                    : std::string("nothing"));
    am = argmax->contiguous();
  }
  const backend::PoolKernels& k = choose(plan, make_problem(plan, dy, PoolPass::input_grad));
  Array dx = Array::empty({plan.n_in, c}, dy.dtype(), dy.device());
  backend::PoolArgs args = make_args(plan, dy.dtype(), c);
  args.dy = dy.raw_data();
  args.dx = dx.raw_data();
  args.argmax = am.defined() ? am.data<std::int32_t>() : nullptr;
  k.input_grad(args);
  return dx;
}

Explanation explain_pool(const PoolPlan& plan, const Array& feats, PoolPass pass) {
  if (pass == PoolPass::forward)
    check_features(plan, feats, "feats", plan.n_in, "N_in");
  else
    check_features(plan, feats, "grad_out", plan.n_out, "N_out");
  Explanation e = explain(make_problem(plan, feats, pass), backend::device_caps(),
                          effective_policy(plan.policy, "pool"));
  // The edge list this plan's pool_edges route built (global pooling, trilinear upsampling).
  if (plan.edges == PoolEdges::batch || plan.edges == PoolEdges::trilinear) {
    PoolEdgesProblem problem;
    problem.op = plan.op;
    problem.pass = plan.edges == PoolEdges::batch ? PoolEdgesPass::batch : PoolEdgesPass::trilinear;
    problem.device = plan.input->coords().device();
    problem.n_rows = plan.edges == PoolEdges::batch ? plan.n_in : plan.n_out;
    e.prior.push_back(explain(problem, backend::device_caps()));
  }
  return e;
}

// ---- one-call conveniences ----------------------------------------------------------------------

SparseTensor pool3d(const SparseTensor& x, PoolMode mode, const PoolOptions& options,
                    const SparseTensor* target) {
  const PoolPlan plan = plan_pool("pool3d", mode, x.coordinate_set(), options,
                                  target ? target->coordinate_set() : nullptr);
  return SparseTensor(plan.output, pool_forward(plan, x.feats()).out);
}

SparseTensor sum_pool3d(const SparseTensor& x, const PoolOptions& options) {
  const PoolPlan plan = plan_pool("sum_pool3d", PoolMode::sum, x.coordinate_set(), options);
  return SparseTensor(plan.output, pool_forward(plan, x.feats()).out);
}

SparseTensor avg_pool3d(const SparseTensor& x, const PoolOptions& options) {
  const PoolPlan plan = plan_pool("avg_pool3d", PoolMode::avg, x.coordinate_set(), options);
  return SparseTensor(plan.output, pool_forward(plan, x.feats()).out);
}

SparseTensor max_pool3d(const SparseTensor& x, const PoolOptions& options) {
  const PoolPlan plan = plan_pool("max_pool3d", PoolMode::max, x.coordinate_set(), options);
  return SparseTensor(plan.output, pool_forward(plan, x.feats()).out);
}

Array global_sum_pool(const SparseTensor& x) {
  return pool_forward(plan_global_pool("global_sum_pool", PoolMode::sum, x.coordinate_set()),
                      x.feats())
      .out;
}

Array global_avg_pool(const SparseTensor& x) {
  return pool_forward(plan_global_pool("global_avg_pool", PoolMode::avg, x.coordinate_set()),
                      x.feats())
      .out;
}

Array global_max_pool(const SparseTensor& x) {
  return pool_forward(plan_global_pool("global_max_pool", PoolMode::max, x.coordinate_set()),
                      x.feats())
      .out;
}

SparseTensor pool_transpose3d(const SparseTensor& x, const PoolOptions& options,
                              const SparseTensor* target) {
  const PoolPlan plan = plan_pool_transpose("pool_transpose3d", x.coordinate_set(), options,
                                            target ? target->coordinate_set() : nullptr);
  return SparseTensor(plan.output, pool_forward(plan, x.feats()).out);
}

SparseTensor trilinear_upsample3d(const SparseTensor& x, std::optional<Int3> stride,
                                  const SparseTensor* target) {
  const PoolPlan plan = plan_trilinear_upsample("trilinear_upsample3d", x.coordinate_set(), stride,
                                                target ? target->coordinate_set() : nullptr);
  return SparseTensor(plan.output, pool_forward(plan, x.feats()).out);
}

}  // namespace lattice::ops
