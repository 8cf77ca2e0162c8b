// Point -> voxel quantization.
#include <cstring>

#include "common.h"
#include "lattice/core/error.h"
#include "lattice/ops/quantize.h"

namespace lattice::python {

void bind_quantize(py::module_& m) {
  m.def(
      "sparse_quantize",
      [](const py::object& points, std::array<double, 3> voxel_size, std::array<double, 3> origin,
         const py::object& batch, const std::optional<std::string>& route, bool drop_invalid) {
        Array p = array_from_capsule(points, "points");
        std::optional<Array> b = optional_array(batch, "batch_indices");
        ops::QuantizeOptions o;
        o.voxel_size = voxel_size;
        o.origin = origin;
        o.drop_invalid = drop_invalid;
        o.policy = parse_policy("sparse_quantize", "quantize", route);
        ops::QuantizeOutput out;
        {
          py::gil_scoped_release release;
          out = ops::sparse_quantize(p, o, b ? &*b : nullptr);
        }
        // drop_invalid adds the kept mask (P) as a fourth element, exported as uint8 0/1 (DLPack
        // consumers such as torch 1.13 do not import bool tensors; the front end casts it back).
        if (drop_invalid) {
          // A device mask is copied through the host (the bool -> uint8 relabelling is a memcpy).
          const Array host = out.kept.to(Device::cpu());
          Array kept = Array::empty({host.dim(0)}, Dtype::u8);
          std::memcpy(kept.raw_data(), host.raw_data(), static_cast<std::size_t>(host.dim(0)));
          kept = kept.to(out.kept.device());
          return py::tuple(py::make_tuple(capsule_from_array(out.coords), capsule_from_array(out.inverse),
                                          capsule_from_array(out.counts), capsule_from_array(kept)));
        }
        // One return type for both branches (pybind11 3 types make_tuple by its arity).
        return py::tuple(py::make_tuple(capsule_from_array(out.coords), capsule_from_array(out.inverse),
                                        capsule_from_array(out.counts)));
      },
      py::arg("points"), py::arg("voxel_size"), py::arg("origin"), py::arg("batch_indices"),
      py::arg("route"), py::arg("drop_invalid") = false);
  m.def("explain_quantize", [](const py::object& points) {
    return ops::explain_quantize(array_from_capsule(points, "points"));
  });
}

}  // namespace lattice::python
