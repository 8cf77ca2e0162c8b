// Packed affine int4/int8 weights (family "quantized"): forward of linear and of a planned
// convolution with a packed weight, their explain(), and the kernel-major dequantization.
#include "common.h"
#include "lattice/core/error.h"
#include "lattice/ops/conv.h"
#include "lattice/ops/quantized.h"

namespace lattice::python {

namespace {

ops::QuantizedLayout parse_layout(const std::string& op, const std::string& s) {
  for (auto l : {ops::QuantizedLayout::linear, ops::QuantizedLayout::kernel_major, ops::QuantizedLayout::dense_5d})
    if (ops::to_string(l) == s) return l;
  throw ValueError("[" + op + "] weight: expected layout 'linear', 'kernel_major' or 'dense_5d', got '" + s + "'");
}

// (packed, scales, biases, bits, group_size, layout, shape) as lattice.ops.quantized passes them.
ops::QuantizedWeight to_weight(const std::string& op, const py::tuple& q) {
  if (py::len(q) != 7) throw ValueError("[" + op + "] weight: expected 7 QuantizedWeight fields, got " + std::to_string(py::len(q)));
  ops::QuantizedWeight w;
  w.packed = array_from_capsule(q[0], "weight.packed");
  w.scales = array_from_capsule(q[1], "weight.scales");
  w.biases = array_from_capsule(q[2], "weight.biases");
  w.bits = q[3].cast<int>();
  w.group_size = q[4].cast<int>();
  w.layout = parse_layout(op, q[5].cast<std::string>());
  w.shape = q[6].cast<std::vector<std::int64_t>>();
  return w;
}

}  // namespace

void bind_quantized(py::module_& m) {
  m.def(
      "quantized_conv_forward",
      [](const ops::ConvPlan& plan, const py::object& feats, const py::tuple& weight, const py::object& bias,
         const std::optional<std::string>& route) {
        Array x = array_from_capsule(feats, "feats");
        const ops::QuantizedWeight w = to_weight(plan.op, weight);
        std::optional<Array> b = optional_array(bias, "bias");
        const RoutePolicy policy = parse_policy(plan.op, "quantized", route);
        Array y;
        {
          py::gil_scoped_release release;
          y = ops::quantized_conv_forward(plan, x, w, b ? &*b : nullptr, policy);
        }
        return capsule_from_array(y);
      },
      py::arg("plan"), py::arg("feats"), py::arg("weight"), py::arg("bias"), py::arg("route"));

  m.def(
      "explain_quantized_conv",
      [](const ops::ConvPlan& plan, const py::object& feats, const py::tuple& weight,
         const std::optional<std::string>& route) {
        Array x = array_from_capsule(feats, "feats");
        return ops::explain_quantized_conv(plan, x, to_weight(plan.op, weight), parse_policy(plan.op, "quantized", route));
      },
      py::arg("plan"), py::arg("feats"), py::arg("weight"), py::arg("route"));

  m.def(
      "quantized_linear",
      [](const py::object& feats, const py::tuple& weight, const py::object& bias,
         const std::optional<std::string>& route) {
        Array x = array_from_capsule(feats, "feats");
        const ops::QuantizedWeight w = to_weight("linear", weight);
        std::optional<Array> b = optional_array(bias, "bias");
        const RoutePolicy policy = parse_policy("linear", "quantized", route);
        Array y;
        {
          py::gil_scoped_release release;
          y = ops::quantized_linear(x, w, b ? &*b : nullptr, policy);
        }
        return capsule_from_array(y);
      },
      py::arg("feats"), py::arg("weight"), py::arg("bias"), py::arg("route"));

  m.def(
      "explain_quantized_linear",
      [](const py::object& feats, const py::tuple& weight, const std::optional<std::string>& route) {
        Array x = array_from_capsule(feats, "feats");
        return ops::explain_quantized_linear(x, to_weight("linear", weight), parse_policy("linear", "quantized", route));
      },
      py::arg("feats"), py::arg("weight"), py::arg("route"));

  m.def(
      "quantized_dequantize_kernel_major",
      [](const py::tuple& weight, const py::object& like) {
        const ops::QuantizedWeight w = to_weight("dequantize", weight);
        Array l = array_from_capsule(like, "like");
        Array y;
        {
          py::gil_scoped_release release;
          y = ops::dequantize_kernel_major("dequantize", w, l.dtype());
        }
        return capsule_from_array(y);
      },
      py::arg("weight"), py::arg("like"));
}

}  // namespace lattice::python
