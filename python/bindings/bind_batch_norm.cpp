// Batch normalisation (+ fused ReLU) of a feature matrix: forward, backward, explain.
#include "common.h"
#include "lattice/core/error.h"
#include "lattice/ops/batch_norm.h"

namespace lattice::python {

namespace {

Array array_or_undefined(const py::object& capsule, const char* what) {
  std::optional<Array> a = optional_array(capsule, what);
  return a ? *a : Array{};
}

ops::BatchNormOptions options_of(const std::string& op, bool training, bool relu, double eps, double momentum,
                                 const std::optional<std::string>& route) {
  ops::BatchNormOptions o;
  o.op = op;
  o.training = training;
  o.relu = relu;
  o.eps = eps;
  o.momentum = momentum;
  o.policy = parse_policy(op, "batch_norm", route);
  return o;
}

// What the backward of one forward call reads, kept as core arrays (x and y share their storage with
// the caller's tensors), so the backward converts only dy.
struct BatchNormState {
  Array x, y, weight, mean, invstd;
  ops::BatchNormOptions options;
};

}  // namespace

void bind_batch_norm(py::module_& m) {
  py::class_<BatchNormState, std::shared_ptr<BatchNormState>>(m, "BatchNormState")
      .def("mean", [](const BatchNormState& s) { return capsule_from_array(s.mean); },
           "(C) the mean the forward normalised with (batch or running).")
      .def("invstd", [](const BatchNormState& s) { return capsule_from_array(s.invstd); },
           "(C) 1 / sqrt(var + eps) of the forward.");

  m.def(
      "batch_norm_apply",
      [](const py::object& x, const py::object& weight, const py::object& bias, const py::object& running_mean,
         const py::object& running_var, bool training, bool relu, double eps, double momentum, const std::string& op,
         const std::optional<std::string>& route, const py::object& residual) {
        auto state = std::make_shared<BatchNormState>();
        state->options = options_of(op, training, relu, eps, momentum, route);
        state->x = array_from_capsule(x, "input");
        state->weight = array_or_undefined(weight, "weight");
        Array b = array_or_undefined(bias, "bias");
        Array rm = array_or_undefined(running_mean, "running_mean");
        Array rv = array_or_undefined(running_var, "running_var");
        Array res = array_or_undefined(residual, "residual");
        ops::BatchNormOutput out;
        {
          py::gil_scoped_release release;
          out = ops::batch_norm_forward(state->x, state->weight, b, rm, rv, state->options, res);
        }
        state->mean = out.mean;
        state->invstd = out.invstd;
        if (relu) state->y = out.y;
        return py::make_tuple(capsule_from_array(out.y), state);
      },
      py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("running_mean"), py::arg("running_var"),
      py::arg("training"), py::arg("relu"), py::arg("eps"), py::arg("momentum"), py::arg("op") = "batch_norm",
      py::arg("route") = py::none(), py::arg("residual") = py::none(),
      "(y, state): batch_norm_forward (y = relu(bn(x) + residual) with a residual) keeping what the backward "
      "reads in `state` (batch_norm_apply_backward).");

  m.def(
      "batch_norm_apply_backward",
      [](const std::shared_ptr<BatchNormState>& state, const py::object& dy, bool need_input, bool need_params,
         bool need_residual) {
        Array d = array_from_capsule(dy, "grad_out");
        ops::BatchNormGrads g;
        {
          py::gil_scoped_release release;
          const BatchNormState& s = *state;
          g = ops::batch_norm_backward(d, s.x, s.y, s.weight, s.mean, s.invstd, need_input, need_params, s.options,
                                       need_residual);
        }
        return py::make_tuple(capsule_or_none(g.dx), capsule_or_none(g.dweight), capsule_or_none(g.dbias),
                              capsule_or_none(g.dresidual));
      },
      py::arg("state"), py::arg("dy"), py::arg("need_input"), py::arg("need_params"), py::arg("need_residual") = false,
      "(dx, dweight, dbias, dresidual) of the forward that made `state` (None where not requested).");

  m.def(
      "explain_batch_norm",
      [](const py::object& x, const std::string& pass, bool training, bool relu, const std::string& op) {
        BatchNormPass p;
        if (pass == "forward")
          p = BatchNormPass::forward;
        else if (pass == "backward")
          p = BatchNormPass::backward;
        else
          throw ValueError("[explain] pass_: expected 'forward' or 'backward', got '" + pass + "'");
        ops::BatchNormOptions o;
        o.op = op;
        o.training = training;
        o.relu = relu;
        return ops::explain_batch_norm(array_from_capsule(x, "input"), p, o);
      },
      py::arg("x"), py::arg("pass"), py::arg("training"), py::arg("relu"), py::arg("op") = "batch_norm");
}

}  // namespace lattice::python
