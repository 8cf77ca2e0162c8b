// Shared helpers of the thin pybind11 bindings: DLPack capsules <-> lattice::Array.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <string_view>

#include "lattice/core/array.h"
#include "lattice/core/vocab.h"
#include "lattice/route/route.h"

namespace lattice::python {

namespace py = pybind11;

// A core Array held on the Python side (core.hold, lattice._core.held): an argument that is passed
// to many calls unchanged (a module's parameters and running statistics) crosses DLPack once and is
// then passed as this object. It shares the tensor's memory and keeps it alive.
struct HeldArray {
  Array array;
};

// Consumes a "dltensor" capsule (renaming it "used_dltensor" as the protocol requires), or takes
// the Array of a HeldArray (not consumed: it can be passed again).
Array array_from_capsule(const py::object& capsule, const char* what);
std::optional<Array> optional_array(const py::object& capsule, const char* what);
// A new "dltensor" capsule owning a reference to `array`'s storage.
py::capsule capsule_from_array(const Array& array);
py::object capsule_or_none(const Array& array);

Int3 to_int3(const py::object& v, const char* what);

// An op's `route=` argument: None lets the table choose; a route name of `family` forces that
// route; any other name raises "[op] route: expected <the family's names, from the route table>".
RoutePolicy parse_policy(const std::string& op, std::string_view family,
                         const std::optional<std::string>& route);

void bind_core(py::module_& m);
void bind_conv(py::module_& m);
void bind_quantize(py::module_& m);
void bind_quantized(py::module_& m);
void bind_io(py::module_& m);
void bind_point_voxel(py::module_& m);
void bind_pool(py::module_& m);
void bind_algebra(py::module_& m);
void bind_coords(py::module_& m);
void bind_batch_norm(py::module_& m);

}  // namespace lattice::python
