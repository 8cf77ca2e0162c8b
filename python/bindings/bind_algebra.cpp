// Sparse algebra: alignment by coordinate value, combine forward/backward, explain.
#include "common.h"
#include "lattice/core/error.h"
#include "lattice/ops/algebra.h"

namespace lattice::python {

namespace {

Join parse_join(const std::string& op, const std::string& s) {
  if (auto j = ops::join_from_string(s)) return *j;
  throw ValueError("[" + op + "] join: expected 'inner', 'left', 'right' or 'outer', got '" + s +
                   "'");
}

AlgebraOp parse_combine(const std::string& s) {
  for (auto o : {AlgebraOp::add, AlgebraOp::sub, AlgebraOp::mul, AlgebraOp::maximum,
                 AlgebraOp::minimum, AlgebraOp::cat})
    if (to_string(o) == s) return o;
  throw ValueError("[lattice] combine: expected add, sub, mul, maximum, minimum or cat, got '" + s +
                   "'");
}

using AlignmentPtr = std::shared_ptr<ops::Alignment>;

}  // namespace

void bind_algebra(py::module_& m) {
  py::class_<ops::Alignment, AlignmentPtr>(m, "Alignment")
      .def_readonly("op", &ops::Alignment::op)
      .def_property_readonly("join",
                             [](const ops::Alignment& a) { return std::string(to_string(a.join)); })
      .def_readonly("identity", &ops::Alignment::identity)
      .def_readonly("lhs", &ops::Alignment::lhs)
      .def_readonly("rhs", &ops::Alignment::rhs)
      .def_readonly("output", &ops::Alignment::output)
      .def_property_readonly("size", &ops::Alignment::size)
      .def(
          "lhs_rows", [](const ops::Alignment& a) { return capsule_or_none(a.lhs_rows); },
          "(M) int64 lhs row of each output row or -1; None for the identity alignment.")
      .def("rhs_rows", [](const ops::Alignment& a) { return capsule_or_none(a.rhs_rows); });

  m.def(
      "align",
      [](const std::string& op, const std::shared_ptr<CoordinateSet>& lhs,
         const std::shared_ptr<CoordinateSet>& rhs, const std::string& join,
         const std::optional<std::string>& route) {
        const Join j = parse_join(op, join);
        const RoutePolicy policy = parse_policy(op, "algebra", route);
        py::gil_scoped_release release;
        return std::const_pointer_cast<ops::Alignment>(ops::align(op, lhs, rhs, j, policy));
      },
      py::arg("op"), py::arg("lhs"), py::arg("rhs"), py::arg("join"),
      py::arg("route") = py::none());

  m.def(
      "algebra_forward",
      [](const AlignmentPtr& a, const std::string& combine, const py::object& lhs,
         const py::object& rhs, double fill, const std::optional<std::string>& route) {
        const AlgebraOp op = parse_combine(combine);
        Array l = array_from_capsule(lhs, "lhs");
        Array r = array_from_capsule(rhs, "rhs");
        const ops::CombineOptions o{fill, parse_policy(a->op, "algebra", route)};
        Array out;
        {
          py::gil_scoped_release release;
          out = ops::combine_forward(*a, op, l, r, o);
        }
        return capsule_from_array(out);
      },
      py::arg("alignment"), py::arg("combine"), py::arg("lhs"), py::arg("rhs"), py::arg("fill"),
      py::arg("route") = py::none());

  m.def(
      "algebra_backward",
      [](const AlignmentPtr& a, const std::string& combine, const py::object& lhs,
         const py::object& rhs, const py::object& grad_out, double fill, bool need_lhs,
         bool need_rhs, const std::optional<std::string>& route) {
        const AlgebraOp op = parse_combine(combine);
        Array l = array_from_capsule(lhs, "lhs");
        Array r = array_from_capsule(rhs, "rhs");
        Array g = array_from_capsule(grad_out, "grad_out");
        const ops::CombineOptions o{fill, parse_policy(a->op, "algebra", route)};
        ops::CombineGrads grads;
        {
          py::gil_scoped_release release;
          grads = ops::combine_backward(*a, op, l, r, g, need_lhs, need_rhs, o);
        }
        return py::make_tuple(capsule_or_none(grads.lhs), capsule_or_none(grads.rhs));
      },
      py::arg("alignment"), py::arg("combine"), py::arg("lhs"), py::arg("rhs"), py::arg("grad_out"),
      py::arg("fill"), py::arg("need_lhs"), py::arg("need_rhs"), py::arg("route") = py::none());

  m.def(
      "explain_align",
      [](const std::string& op, const std::shared_ptr<CoordinateSet>& lhs,
         const std::shared_ptr<CoordinateSet>& rhs, const std::string& join) {
        return ops::explain_align(op, *lhs, *rhs, parse_join(op, join));
      },
      py::arg("op"), py::arg("lhs"), py::arg("rhs"), py::arg("join"));

  m.def(
      "explain_combine",
      [](const AlignmentPtr& a, const std::string& combine, const std::string& pass,
         const py::object& lhs, const py::object& rhs) {
        const AlgebraOp op = parse_combine(combine);
        AlgebraPass p;
        if (pass == "forward")
          p = AlgebraPass::forward;
        else if (pass == "backward")
          p = AlgebraPass::backward;
        else
          throw ValueError("[explain] pass_: expected 'align', 'forward' or 'backward', got '" +
                           pass + "'");
        Array l = array_from_capsule(lhs, "lhs");
        Array r = array_from_capsule(rhs, "rhs");
        const std::int64_t channels = op == AlgebraOp::cat ? l.dim(1) + r.dim(1) : l.dim(1);
        return ops::explain_combine(*a, op, p, l.dtype(), channels);
      },
      py::arg("alignment"), py::arg("combine"), py::arg("pass"), py::arg("lhs"), py::arg("rhs"));
}

}  // namespace lattice::python
