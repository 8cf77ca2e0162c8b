// Point -> voxel quantization.
#include "common.h"
#include "lattice/core/error.h"
#include "lattice/ops/quantize.h"

namespace lattice::python {

void bind_quantize(py::module_& m) {
  m.def(
      "sparse_quantize",
      [](const py::object& points, std::array<double, 3> voxel_size, std::array<double, 3> origin,
         const py::object& batch, const std::optional<std::string>& route) {
        Array p = array_from_capsule(points, "points");
        std::optional<Array> b = optional_array(batch, "batch_indices");
        ops::QuantizeOptions o;
        o.voxel_size = voxel_size;
        o.origin = origin;
        if (route) {
          o.policy.force = route_from_string("quantize", *route);
          if (!o.policy.force)
            throw ValueError("[sparse_quantize] route: expected 'reference', got '" + *route + "'");
        }
        ops::QuantizeOutput out;
        {
          py::gil_scoped_release release;
          out = ops::sparse_quantize(p, o, b ? &*b : nullptr);
        }
        return py::make_tuple(capsule_from_array(out.coords), capsule_from_array(out.inverse),
                              capsule_from_array(out.counts));
      },
      py::arg("points"), py::arg("voxel_size"), py::arg("origin"), py::arg("batch_indices"), py::arg("route"));
  m.def("explain_quantize", [](const py::object& points) {
    return ops::explain_quantize(array_from_capsule(points, "points"));
  });
}

}  // namespace lattice::python
