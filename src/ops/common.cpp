#include "ops/common.h"

#include <cstdlib>
#include <string>

#include "lattice/core/error.h"

namespace lattice::ops {

RoutePolicy effective_policy(const RoutePolicy& policy, std::string_view family) {
  if (policy.force) return policy;
  const char* env = std::getenv("LATTICE_FORCE_ROUTE");
  if (!env || !*env) return policy;
  std::string_view spec(env);
  if (auto colon = spec.find(':'); colon != std::string_view::npos) {
    if (spec.substr(0, colon) != family) return policy;
    spec = spec.substr(colon + 1);
  }
  auto id = route_from_string(family, spec);
  if (!id) {
    // A route name of another family (no prefix given) leaves this family alone.
    for (std::string_view other : route_families())
      if (other != family && route_from_string(other, spec)) return policy;
    std::string got = "'";
    got.append(env).append("'");
    throw_value_error("LATTICE_FORCE_ROUTE", "route", "a route name of " + std::string(family), got);
  }
  RoutePolicy p = policy;
  p.force = id;
  return p;
}

RouteId chosen_or_throw(const Explanation& e) {
  if (e.chosen) return *e.chosen;
  if (e.forced)
    throw_value_error(e.op, "route", "an admitted route",
                      "'" + std::string(to_string(*e.forced)) + "' (rejected: " + e.forced_reason + ")");
  throw UnsupportedError("[" + e.op + "] no route admitted this problem\n" + e.to_string());
}

// ---- relation planning (conv, pool) ------------------------------------------------------------

void check_geometry(std::string_view op, const KernelSpec& g, RelationKind kind) {
  auto all = [](const Int3& v, auto pred) { return pred(v[0]) && pred(v[1]) && pred(v[2]); };
  if (!all(g.size, [](int v) { return v >= 1; }))
    throw_value_error(op, "kernel_size", "sizes >= 1", to_string(g.size));
  if (!all(g.stride, [](int v) { return v >= 1; }))
    throw_value_error(op, "stride", "strides >= 1", to_string(g.stride));
  if (!all(g.padding, [](int v) { return v >= 0; }))
    throw_value_error(op, "padding", "paddings >= 0", to_string(g.padding));
  if (!all(g.dilation, [](int v) { return v >= 1; }))
    throw_value_error(op, "dilation", "dilations >= 1", to_string(g.dilation));
  if (g.expand && kind != RelationKind::forward)
    throw_value_error(op, "expand", "False (expand applies to " + std::string(op) + " without a target)",
                      "True");
  if (kind == RelationKind::submanifold) {
    if (!all(g.size, [](int v) { return v % 2 == 1; }))
      throw_value_error(op, "kernel_size", "odd sizes on every axis for a submanifold convolution",
                        to_string(g.size));
    if (g.stride != Int3{1, 1, 1})
      throw_value_error(op, "stride", "(1, 1, 1) for a submanifold convolution", to_string(g.stride));
  }
  if (kind == RelationKind::generative && g.padding != Int3{0, 0, 0})
    throw_value_error(op, "padding", "(0, 0, 0) for a generative convolution", to_string(g.padding));
  if (g.size[0] * static_cast<std::int64_t>(g.size[1]) * g.size[2] > (1 << 20))
    throw_value_error(op, "kernel_size", "a kernel volume <= 2^20", to_string(g.size));
}

Int3 output_stride(std::string_view op, RelationKind kind, Int3 in, Int3 s) {
  Int3 out{};
  for (int a = 0; a < 3; ++a) {
    if (is_transposed_kind(kind)) {
      if (in[a] % s[a] != 0)
        throw_value_error(op, "stride",
                          "a divisor of the input tensor stride " + to_string(in) +
                              " (output stride = input stride / stride)",
                          to_string(s));
      out[a] = in[a] / s[a];
    } else {
      const std::int64_t v = static_cast<std::int64_t>(in[a]) * s[a];
      if (v > 2147483647)
        throw_value_error(op, "stride", "an output tensor stride within int32", std::to_string(v));
      out[a] = static_cast<std::int32_t>(v);
    }
  }
  return out;
}

PlannedRelation plan_relation(std::string_view op, RelationKind kind,
                              const std::shared_ptr<CoordinateSet>& x, const KernelSpec& requested,
                              const std::shared_ptr<CoordinateSet>& target) {
  check_geometry(op, requested, kind);
  const bool needs_target = kind == RelationKind::target || kind == RelationKind::transposed_target;
  if (needs_target && !target)
    throw_value_error(op, "coordinates", "a target SparseTensor for a target relation", "None");
  if (!x) throw_value_error(op, "input", "a SparseTensor", "an empty SparseTensor");
  PlannedRelation planned;
  planned.spec = requested;
  if (kind == RelationKind::submanifold) planned.spec.stride = Int3{1, 1, 1};
  if (kind == RelationKind::submanifold || kind == RelationKind::generative)
    planned.spec.padding = Int3{0, 0, 0};
  const Int3 out_stride = output_stride(op, kind, x->stride(), planned.spec.stride);
  std::shared_ptr<CoordinateSet> target_set;
  if (needs_target) {
    target_set = target;
    if (target->coords().device() != x->coords().device())
      throw_value_error(op, "coordinates", "the device of the input (" + to_string(x->coords().device()) + ")",
                        to_string(target->coords().device()));
    if (target->stride() != out_stride)
      throw_value_error(op, "coordinates", "a target at the output stride " + to_string(out_stride),
                        "stride " + to_string(target->stride()));
  }
  auto result = x->relation(kind, planned.spec, target_set, op);
  planned.relation = std::move(result.relation);
  planned.output = std::move(result.output);
  LATTICE_ASSERT(planned.output && planned.output->stride() == out_stride, "relation output stride mismatch");
  return planned;
}

backend::RelationView relation_view(const Relation& r, unsigned reads) {
  backend::RelationView v;
  v.n_in = r.n_in;
  v.n_out = r.n_out;
  v.kernel_volume = r.kernel_volume;
  v.identity = r.identity;
  v.known_edges = r.known_edges();
  // The per-offset grouping first: for an uncounted relation it finds the count and the host
  // bounds in one read-back, which the count and host_k_ptr below then reuse.
  if (reads & kViewOffsetGrouping) {
    v.k_ptr = r.k_ptr().data<std::int64_t>();
    v.k_in = r.k_in().data<std::int32_t>();
    v.k_out = r.k_out().data<std::int32_t>();
  }
  if (reads & kViewEdgeCount) v.n_edges = r.n_edges();
  if (reads & kViewEdgeList) {
    v.in_idx = r.in_idx().data<std::int32_t>();
    v.out_idx = r.out_idx().data<std::int32_t>();
    v.k_idx = r.k_idx().data<std::int32_t>();
  }
  if (reads & kViewOutPtr) v.out_ptr = r.out_ptr().data<std::int64_t>();
  if (reads & kViewHostKPtr) {
    v.host_k_ptr_owner = &r;
    v.host_k_ptr_of = [](const void* owner) { return static_cast<const Relation*>(owner)->host_k_ptr().data(); };
  }
  if (reads & kViewInputGrouping) {
    const Relation::InputGrouping& g = r.input_grouping();
    v.in_ptr = g.in_ptr.data<std::int64_t>();
    v.kt_in = g.kt_in.data<std::int32_t>();
    v.kt_out = g.kt_out.data<std::int32_t>();
  }
  if (reads & kViewGemmMap) v.gemm_map = r.gemm_map().data<std::int32_t>();
  if (reads & kViewGemmOrder) {
    const Array& order = r.gemm_order();
    if (order.defined()) v.gemm_order = order.data<std::int32_t>();
  }
  if (reads & kViewInputGemmMap) v.input_gemm_map = r.input_gemm_map().data<std::int32_t>();
  if (reads & kViewInputGemmOrder) {
    const Array& order = r.input_gemm_order();
    if (order.defined()) v.input_gemm_order = order.data<std::int32_t>();
  }
  return v;
}

}  // namespace lattice::ops
