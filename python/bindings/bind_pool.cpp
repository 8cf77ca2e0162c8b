// Pooling family: plans (local, global, transposed, trilinear), forward, backward, explain; the
// pure route table for tests.
#include "common.h"
#include "lattice/core/error.h"
#include "lattice/ops/diagnostics.h"
#include "lattice/ops/pool.h"

namespace lattice::python {

namespace {

PoolMode parse_mode(const std::string& op, const std::string& s) {
  for (auto m : {PoolMode::sum, PoolMode::avg, PoolMode::max})
    if (to_string(m) == s) return m;
  throw ValueError("[" + op + "] mode: expected 'sum', 'avg' or 'max', got '" + s + "'");
}

PoolPass parse_pool_pass(const std::string& s) {
  for (auto p : {PoolPass::forward, PoolPass::input_grad})
    if (to_string(p) == s) return p;
  throw ValueError("[explain] pass: expected 'forward' or 'input_grad' for a pooling op, got '" +
                   s + "'");
}

ops::PoolOptions options(const std::string& op, bool deterministic,
                         const std::optional<std::string>& route) {
  ops::PoolOptions o;
  o.deterministic = deterministic;
  o.policy = parse_policy(op, "pool", route);
  return o;
}

std::shared_ptr<ops::PoolPlan> share(ops::PoolPlan plan) {
  return std::make_shared<ops::PoolPlan>(std::move(plan));
}

}  // namespace

void bind_pool(py::module_& m) {
  py::class_<ops::PoolPlan, std::shared_ptr<ops::PoolPlan>>(m, "PoolPlan")
      .def_readonly("op", &ops::PoolPlan::op)
      .def_property_readonly("mode",
                             [](const ops::PoolPlan& p) { return std::string(to_string(p.mode)); })
      .def_property_readonly("edges",
                             [](const ops::PoolPlan& p) { return std::string(to_string(p.edges)); })
      .def_readonly("n_in", &ops::PoolPlan::n_in)
      .def_readonly("n_out", &ops::PoolPlan::n_out)
      .def_readonly("n_edges", &ops::PoolPlan::n_edges)
      .def_property_readonly(
          "relation",
          [](const ops::PoolPlan& p) { return std::const_pointer_cast<Relation>(p.relation); })
      .def_readonly("input", &ops::PoolPlan::input)
      .def_readonly("output", &ops::PoolPlan::output)
      .def(
          "arrays",
          [](const ops::PoolPlan& p) {
            py::dict d;
            d["out_ptr"] = capsule_from_array(p.out_ptr);
            d["in_idx"] = capsule_from_array(p.in_idx);
            d["weights"] = capsule_or_none(p.weights);
            return d;
          },
          "Output-major edges (out_ptr int64, in_idx int32, weights float64 or None) as DLPack "
          "capsules.");

  m.def(
      "plan_pool",
      [](const std::string& op, const std::string& mode, const std::shared_ptr<CoordinateSet>& x,
         const py::object& kernel_size, const py::object& stride, const py::object& padding,
         const py::object& dilation, bool expand, bool deterministic,
         const std::optional<std::string>& route, const std::shared_ptr<CoordinateSet>& target) {
        ops::PoolOptions o = options(op, deterministic, route);
        o.kernel_size = to_int3(kernel_size, "kernel_size");
        o.stride = to_int3(stride, "stride");
        o.padding = to_int3(padding, "padding");
        o.dilation = to_int3(dilation, "dilation");
        o.expand = expand;
        const PoolMode md = parse_mode(op, mode);
        py::gil_scoped_release release;
        return share(ops::plan_pool(op, md, x, o, target));
      },
      py::arg("op"), py::arg("mode"), py::arg("x"), py::arg("kernel_size"), py::arg("stride"),
      py::arg("padding"), py::arg("dilation"), py::arg("expand"), py::arg("deterministic"),
      py::arg("route"), py::arg("target"));

  m.def(
      "plan_global_pool",
      [](const std::string& op, const std::string& mode, const std::shared_ptr<CoordinateSet>& x,
         bool deterministic, const std::optional<std::string>& route) {
        const ops::PoolOptions o = options(op, deterministic, route);
        const PoolMode md = parse_mode(op, mode);
        py::gil_scoped_release release;
        return share(ops::plan_global_pool(op, md, x, o));
      },
      py::arg("op"), py::arg("mode"), py::arg("x"), py::arg("deterministic"), py::arg("route"));

  m.def(
      "plan_pool_transpose",
      [](const std::string& op, const std::shared_ptr<CoordinateSet>& x,
         const py::object& kernel_size, const py::object& stride, const py::object& padding,
         const py::object& dilation, bool deterministic, const std::optional<std::string>& route,
         const std::shared_ptr<CoordinateSet>& target) {
        ops::PoolOptions o = options(op, deterministic, route);
        o.kernel_size = to_int3(kernel_size, "kernel_size");
        o.stride = to_int3(stride, "stride");
        o.padding = to_int3(padding, "padding");
        o.dilation = to_int3(dilation, "dilation");
        py::gil_scoped_release release;
        return share(ops::plan_pool_transpose(op, x, o, target));
      },
      py::arg("op"), py::arg("x"), py::arg("kernel_size"), py::arg("stride"), py::arg("padding"),
      py::arg("dilation"), py::arg("deterministic"), py::arg("route"), py::arg("target"));

  m.def(
      "plan_trilinear_upsample",
      [](const std::string& op, const std::shared_ptr<CoordinateSet>& x, const py::object& stride,
         bool deterministic, const std::optional<std::string>& route,
         const std::shared_ptr<CoordinateSet>& target) {
        const ops::PoolOptions o = options(op, deterministic, route);
        std::optional<Int3> s;
        if (!stride.is_none()) s = to_int3(stride, "stride");
        py::gil_scoped_release release;
        return share(ops::plan_trilinear_upsample(op, x, s, target, o));
      },
      py::arg("op"), py::arg("x"), py::arg("stride"), py::arg("deterministic"), py::arg("route"),
      py::arg("target"));

  m.def(
      "pool_forward",
      [](const ops::PoolPlan& plan, const py::object& feats) {
        Array x = array_from_capsule(feats, "feats");
        ops::PoolOutput out;
        {
          py::gil_scoped_release release;
          out = ops::pool_forward(plan, x);
        }
        return py::make_tuple(capsule_from_array(out.out), capsule_or_none(out.argmax));
      },
      py::arg("plan"), py::arg("feats"));

  m.def(
      "pool_backward",
      [](const ops::PoolPlan& plan, const py::object& grad_out, const py::object& argmax) {
        Array dy = array_from_capsule(grad_out, "grad_out");
        std::optional<Array> am = optional_array(argmax, "argmax");
        Array dx;
        {
          py::gil_scoped_release release;
          dx = ops::pool_backward(plan, dy, am ? &*am : nullptr);
        }
        return capsule_from_array(dx);
      },
      py::arg("plan"), py::arg("grad_out"), py::arg("argmax"));

  m.def(
      "explain_pool",
      [](const ops::PoolPlan& plan, const py::object& feats, const std::string& pass) {
        Array x = array_from_capsule(feats, "feats");
        return ops::explain_pool(plan, x, parse_pool_pass(pass));
      },
      py::arg("plan"), py::arg("feats"), py::arg("pass_") = "forward");

  // The pure route table on a described problem (for route-table tests).
  m.def(
      "explain_pool_problem",
      [](const py::dict& problem, const std::optional<std::string>& route) {
        PoolProblem p;
        auto get_str = [&](const char* k, const std::string& dflt) {
          return problem.contains(k) ? problem[k].cast<std::string>() : dflt;
        };
        auto get = [&](const char* k, std::int64_t dflt) {
          return problem.contains(k) ? problem[k].cast<std::int64_t>() : dflt;
        };
        p.op = get_str("op", "max_pool3d");
        const std::string mode = get_str("mode", "max");
        p.mode = mode == "weighted" ? PoolMode::weighted : parse_mode(p.op, mode);
        p.pass = parse_pool_pass(get_str("pass", "forward"));
        const std::string edges = get_str("edges", "forward");
        bool found = false;
        for (auto e : {PoolEdges::forward, PoolEdges::target, PoolEdges::transposed,
                       PoolEdges::transposed_target, PoolEdges::batch, PoolEdges::trilinear})
          if (to_string(e) == edges) p.edges = e, found = true;
        if (!found)
          throw ValueError("[explain] edges: expected a pooling edge source, got '" + edges + "'");
        if (problem.contains("device") && problem["device"].cast<std::string>() != "cpu")
          p.device = Device::cuda(0);
        if (problem.contains("dtype")) {
          const auto d = problem["dtype"].cast<std::string>();
          for (auto t : {Dtype::f16, Dtype::bf16, Dtype::f32, Dtype::f64, Dtype::i32, Dtype::i64})
            if (to_string(t) == d) p.dtype = t;
        }
        p.n_in = get("n_in", 0);
        p.n_out = get("n_out", 0);
        p.channels = get("channels", 1);
        p.n_edges = get("n_edges", 0);
        if (problem.contains("kernel_size"))
          p.spec.size = to_int3(problem["kernel_size"], "kernel_size");
        if (problem.contains("stride")) p.spec.stride = to_int3(problem["stride"], "stride");
        if (problem.contains("dilation"))
          p.spec.dilation = to_int3(problem["dilation"], "dilation");
        if (problem.contains("padding")) p.spec.padding = to_int3(problem["padding"], "padding");
        RoutePolicy policy;
        if (route) policy = options(p.op, true, route).policy;
        return explain(p, device_caps(), policy);
      },
      py::arg("problem"), py::arg("route") = py::none());
}

}  // namespace lattice::python
