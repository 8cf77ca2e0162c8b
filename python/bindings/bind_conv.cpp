// Convolution family: plan (relation), forward, backward, explain; route-table access for tests.
#include "common.h"
#include "lattice/core/error.h"
#include "lattice/ops/conv.h"
#include "lattice/ops/diagnostics.h"
#include "lattice/route/tuning.h"

namespace lattice::python {

namespace {

RelationKind parse_kind(const std::string& s) {
  for (auto k : {RelationKind::submanifold, RelationKind::forward, RelationKind::target, RelationKind::transposed,
                 RelationKind::transposed_target, RelationKind::generative})
    if (to_string(k) == s) return k;
  throw ValueError("[lattice] kind: expected a relation kind, got '" + s + "'");
}

ConvPass parse_pass(const std::string& s) {
  for (auto p : {ConvPass::forward, ConvPass::input_grad, ConvPass::weight_grad})
    if (to_string(p) == s) return p;
  throw ValueError("[explain] pass: expected 'forward', 'input_grad' or 'weight_grad', got '" + s + "'");
}

Dtype parse_dtype(const std::string& s) {
  for (auto d : {Dtype::f16, Dtype::bf16, Dtype::f32, Dtype::f64, Dtype::i32, Dtype::i64, Dtype::u8, Dtype::u32,
                 Dtype::boolean})
    if (to_string(d) == s) return d;
  throw ValueError("[explain] dtype: expected a dtype name like 'float32', got '" + s + "'");
}

}  // namespace

void bind_conv(py::module_& m) {
  py::class_<Explanation>(m, "Explanation")
      .def_readonly("op", &Explanation::op)
      .def_readonly("problem", &Explanation::problem)
      .def_readonly("caps", &Explanation::caps)
      .def_property_readonly("chosen", [](const Explanation& e) -> py::object {
        if (!e.chosen) return py::none();
        return py::str(std::string(to_string(*e.chosen)));
      })
      .def_property_readonly("forced", [](const Explanation& e) -> py::object {
        if (!e.forced) return py::none();
        return py::str(std::string(to_string(*e.forced)));
      })
      .def_readonly("forced_reason", &Explanation::forced_reason)
      // the measured choice behind this decision (lattice.tune), "" when none covers it
      .def_readonly("tuned", &Explanation::tuned)
      .def_readonly("tuned_chosen", &Explanation::tuned_chosen)
      .def_property_readonly("rows", [](const Explanation& e) {
        py::list rows;
        for (const auto& r : e.rows) {
          py::dict d;
          d["route"] = std::string(to_string(r.id));
          d["rank"] = r.rank;
          d["admitted"] = r.verdict.admitted;
          d["reason"] = r.verdict.reason;
          d["chosen"] = e.chosen && *e.chosen == r.id;
          rows.append(d);
        }
        return rows;
      })
      .def_readonly("stages", &Explanation::stages)
      .def_readonly("prior", &Explanation::prior)
      .def("__str__", &Explanation::to_string)
      .def("__repr__", &Explanation::to_string);

  py::class_<ops::ConvPlan, std::shared_ptr<ops::ConvPlan>>(m, "ConvPlan")
      .def_readonly("op", &ops::ConvPlan::op)
      .def_property_readonly("kind", [](const ops::ConvPlan& p) { return std::string(to_string(p.kind)); })
      .def_property_readonly("relation",
                             [](const ops::ConvPlan& p) { return std::const_pointer_cast<Relation>(p.relation); })
      .def_readonly("input", &ops::ConvPlan::input)
      .def_readonly("output", &ops::ConvPlan::output);

  m.def(
      "plan_conv",
      [](const std::string& op, const std::string& kind, const std::shared_ptr<CoordinateSet>& x,
         const py::object& kernel_size, const py::object& stride, const py::object& padding,
         const py::object& dilation, bool expand, bool deterministic, bool allow_tf32,
         const std::optional<std::string>& route, const std::shared_ptr<CoordinateSet>& target) {
        ops::ConvOptions o;
        o.kernel_size = to_int3(kernel_size, "kernel_size");
        o.stride = to_int3(stride, "stride");
        o.padding = to_int3(padding, "padding");
        o.dilation = to_int3(dilation, "dilation");
        o.expand = expand;
        o.deterministic = deterministic;
        o.allow_tf32 = allow_tf32;
        o.policy = parse_policy(op, "conv", route);
        const RelationKind k = parse_kind(kind);
        py::gil_scoped_release release;
        return std::make_shared<ops::ConvPlan>(ops::plan_conv(op, k, x, o, target));
      },
      py::arg("op"), py::arg("kind"), py::arg("x"), py::arg("kernel_size"), py::arg("stride"),
      py::arg("padding"), py::arg("dilation"), py::arg("expand"), py::arg("deterministic"),
      py::arg("allow_tf32"), py::arg("route"), py::arg("target"));

  m.def(
      "conv_forward",
      [](const ops::ConvPlan& plan, const py::object& feats, const py::object& weight, const py::object& bias) {
        Array x = array_from_capsule(feats, "feats");
        Array w = array_from_capsule(weight, "weight");
        std::optional<Array> b = optional_array(bias, "bias");
        Array y;
        {
          py::gil_scoped_release release;
          y = ops::conv_forward(plan, x, w, b ? &*b : nullptr);
        }
        return capsule_from_array(y);
      },
      py::arg("plan"), py::arg("feats"), py::arg("weight"), py::arg("bias"));

  m.def(
      "conv_backward",
      [](const ops::ConvPlan& plan, const py::object& feats, const py::object& weight, const py::object& grad_out,
         bool need_input, bool need_weight, bool need_bias, const std::optional<std::string>& weight_grad_layout,
         const std::optional<std::string>& weight_grad_dtype) {
        Array x = array_from_capsule(feats, "feats");
        Array w = array_from_capsule(weight, "weight");
        Array dy = array_from_capsule(grad_out, "grad_out");
        ops::ConvGradRequest request{need_input, need_weight, need_bias, std::nullopt};
        if (weight_grad_layout || weight_grad_dtype) {
          // the caller's parameter form (conv_compute_weight was passed): both or neither
          if (!weight_grad_layout || !weight_grad_dtype)
            throw ValueError("[conv_backward] weight_grad_layout: expected weight_grad_layout and "
                             "weight_grad_dtype together, got only one");
          ops::WeightGradForm form;
          if (*weight_grad_layout == "dense") form.layout = WeightLayout::dense;
          else if (*weight_grad_layout == "kernel_major") form.layout = WeightLayout::kernel_major;
          else throw ValueError("[conv_backward] weight_grad_layout: expected 'dense' or 'kernel_major', got '" +
                                *weight_grad_layout + "'");
          form.dtype = parse_dtype(*weight_grad_dtype);
          request.weight_as = form;
        }
        ops::ConvGrads g;
        {
          py::gil_scoped_release release;
          g = ops::conv_backward(plan, x, w, dy, request);
        }
        return py::make_tuple(capsule_or_none(g.input), capsule_or_none(g.weight), capsule_or_none(g.bias));
      },
      py::arg("plan"), py::arg("feats"), py::arg("weight"), py::arg("grad_out"), py::arg("need_input"),
      py::arg("need_weight"), py::arg("need_bias"), py::arg("weight_grad_layout") = py::none(),
      py::arg("weight_grad_dtype") = py::none());

  m.def(
      "conv_compute_weight",
      [](const ops::ConvPlan& plan, const py::object& feats, const py::object& weight) {
        Array x = array_from_capsule(feats, "feats");
        Array w = array_from_capsule(weight, "weight");
        Array out;
        {
          py::gil_scoped_release release;
          out = ops::conv_compute_weight(plan, x, w);
        }
        return capsule_from_array(out);
      },
      py::arg("plan"), py::arg("feats"), py::arg("weight"));

  m.def(
      "explain_conv",
      [](const ops::ConvPlan& plan, const py::object& feats, const py::object& weight, const std::string& pass) {
        Array x = array_from_capsule(feats, "feats");
        Array w = array_from_capsule(weight, "weight");
        return ops::explain_conv(plan, x, w, parse_pass(pass));
      },
      py::arg("plan"), py::arg("feats"), py::arg("weight"), py::arg("pass_") = "forward");

  // The pure route table on a described problem and (possibly simulated) capabilities.
  m.def(
      "explain_conv_problem",
      [](const py::dict& problem, const py::dict& caps, const std::optional<std::string>& route) {
        ConvProblem p;
        p.op = problem.contains("op") ? problem["op"].cast<std::string>() : "conv3d";
        if (problem.contains("relation")) p.relation = parse_kind(problem["relation"].cast<std::string>());
        if (problem.contains("pass")) p.pass = parse_pass(problem["pass"].cast<std::string>());
        if (problem.contains("dtype")) p.dtype = parse_dtype(problem["dtype"].cast<std::string>());
        if (problem.contains("device")) {
          const auto d = problem["device"].cast<std::string>();
          p.device = d == "cpu" ? Device::cpu() : Device::cuda(d.size() > 5 ? std::stoi(d.substr(5)) : 0);
        }
        auto get = [&](const char* k, std::int64_t dflt) {
          return problem.contains(k) ? problem[k].cast<std::int64_t>() : dflt;
        };
        p.n_in = get("n_in", 0);
        p.n_out = get("n_out", 0);
        p.c_in = get("c_in", 1);
        p.c_out = get("c_out", 1);
        p.kernel_volume = get("kernel_volume", 1);
        p.n_edges = get("n_edges", 0);
        p.identity_relation = problem.contains("identity_relation") && problem["identity_relation"].cast<bool>();
        p.deterministic = !problem.contains("deterministic") || problem["deterministic"].cast<bool>();
        p.allow_tf32 = problem.contains("allow_tf32") && problem["allow_tf32"].cast<bool>();
        DeviceCaps c = device_caps();
        if (caps.contains("blas")) c.cpu.blas = caps["blas"].cast<std::string>();
        if (caps.contains("cuda_built")) c.cuda.built = caps["cuda_built"].cast<bool>();
        if (caps.contains("sm")) {
          c.cuda.sm = caps["sm"].cast<int>();
          c.cuda.tier = tier_for_sm(c.cuda.sm);
          c.cuda.device_count = c.cuda.sm > 0 ? 1 : 0;
          c.cuda.name = "simulated";
          c.cuda.status = "simulated";
        }
        return explain(p, c, parse_policy(p.op, "conv", route));
      },
      py::arg("problem"), py::arg("caps") = py::dict(), py::arg("route") = py::none());
  m.def("tier_for_sm", [](int sm) { return std::string(to_string(tier_for_sm(sm))); });

  // Measured route choices (lattice/route/tuning.h; lattice/tuning.py saves and loads them).
  m.def("set_conv_tuning", &ops::set_conv_tuning, py::arg("enabled"), py::arg("reps") = 5);
  m.def("conv_tuning_enabled", &ops::conv_tuning_enabled);
  m.def("tuning_build_id", &tuning_build_id);
  m.def("clear_tuned", &clear_tuned);
  m.def("tuned_entries", [] {
    py::list out;
    for (const auto& [key, choice] : tuned_entries()) {
      py::list times;
      for (const TunedTime& t : choice.times)
        times.append(py::make_tuple(std::string(to_string(t.route)), t.ms >= 0 ? py::object(py::float_(t.ms)) : py::object(py::none()),
                                    t.error));
      py::dict d;
      d["key"] = key;
      d["route"] = std::string(to_string(choice.route));
      d["times"] = times;
      out.append(d);
    }
    return out;
  });
  // Records one choice (loading a saved table): route names of the conv family; `times` as
  // tuned_entries gives them ((route, ms or None, error) triples).
  m.def(
      "set_tuned",
      [](const std::string& key, const std::string& route, const std::vector<py::tuple>& times) {
        const auto parse = [](const std::string& name) {
          const std::optional<RouteId> id = route_from_string("conv", name);
          if (!id) throw ValueError("[load_tuning] route: expected " + route_name_list("conv") + ", got '" + name + "'");
          return *id;
        };
        if (key.empty()) throw ValueError("[load_tuning] key: expected a tuning bucket key, got ''");
        TunedChoice c{parse(route), {}};
        for (const py::tuple& t : times) {
          if (t.size() != 3)
            throw ValueError("[load_tuning] times: expected (route, ms or None, error) triples, got a tuple of " +
                             std::to_string(t.size()));
          TunedTime m{parse(t[0].cast<std::string>()), t[1].is_none() ? -1.0 : t[1].cast<double>(),
                      t[2].cast<std::string>()};
          c.times.push_back(std::move(m));
        }
        set_tuned(key, std::move(c));
      },
      py::arg("key"), py::arg("route"), py::arg("times"));
}

}  // namespace lattice::python
