// The `_lattice` extension: errors, DLPack crossing, and one bind_<family>() per op family.
// It does not link libtorch; tensors cross as DLPack capsules.
#include <cstring>

#include "common.h"
#include "lattice/core/error.h"

namespace lattice::python {

Array array_from_capsule(const py::object& obj, const char* what) {
  if (!PyCapsule_CheckExact(obj.ptr())) {
    if (py::isinstance<HeldArray>(obj)) return obj.cast<const HeldArray&>().array;
    throw TypeError(std::string("[lattice] ") + what + ": expected a DLPack capsule, got " +
                    std::string(py::str(obj.get_type())));
  }
  if (!PyCapsule_IsValid(obj.ptr(), "dltensor"))
    throw ValueError(std::string("[lattice] ") + what + ": expected an unconsumed DLPack capsule, got a used one");
  auto* managed = static_cast<LatticeDLManagedTensor*>(PyCapsule_GetPointer(obj.ptr(), "dltensor"));
  PyCapsule_SetName(obj.ptr(), "used_dltensor");
  PyCapsule_SetDestructor(obj.ptr(), nullptr);
  return Array::from_dlpack(managed);
}

std::optional<Array> optional_array(const py::object& obj, const char* what) {
  if (obj.is_none()) return std::nullopt;
  return array_from_capsule(obj, what);
}

static void capsule_destructor(PyObject* capsule) {
  // Only an unconsumed capsule still owns its tensor.
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    auto* managed = static_cast<LatticeDLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    if (managed && managed->deleter) managed->deleter(managed);
  } else {
    PyErr_Clear();
  }
}

py::capsule capsule_from_array(const Array& array) {
  LatticeDLManagedTensor* managed = array.to_dlpack();
  PyObject* cap = PyCapsule_New(managed, "dltensor", capsule_destructor);
  if (!cap) {
    managed->deleter(managed);
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::capsule>(cap);
}

py::object capsule_or_none(const Array& array) {
  if (!array.defined()) return py::none();
  return capsule_from_array(array);
}

Int3 to_int3(const py::object& v, const char* what) {
  if (py::isinstance<py::int_>(v)) {
    const long long x = v.cast<long long>();
    if (x < -2147483648LL || x > 2147483647LL)
      throw ValueError(std::string("[lattice] ") + what + ": expected int32 values, got " + std::to_string(x));
    const auto i = static_cast<std::int32_t>(x);
    return {i, i, i};
  }
  auto seq = v.cast<py::sequence>();
  if (py::len(seq) != 3)
    throw ValueError(std::string("[lattice] ") + what + ": expected an int or 3 ints, got " +
                     std::to_string(py::len(seq)) + " values");
  Int3 out{};
  for (int i = 0; i < 3; ++i) out[i] = seq[i].cast<std::int32_t>();
  return out;
}

RoutePolicy parse_policy(const std::string& op, std::string_view family,
                         const std::optional<std::string>& route) {
  RoutePolicy p;
  if (route) {
    p.force = route_from_string(family, *route);
    if (!p.force)
      throw ValueError("[" + op + "] route: expected " + route_name_list(family) + ", got '" + *route + "'");
  }
  return p;
}

}  // namespace lattice::python

PYBIND11_MODULE(_lattice, m) {
  namespace py = pybind11;
  using namespace lattice;
  m.doc() = "lattice core extension (internal; use the `lattice` package)";
  static py::exception<UnsupportedError> unsupported(m, "UnsupportedError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const TypeError& e) {
      PyErr_SetString(PyExc_TypeError, e.what());
    } catch (const UnsupportedError& e) {
      PyErr_SetString(unsupported.ptr(), e.what());
    } catch (const Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });
  py::class_<python::HeldArray>(m, "HeldArray",
                                "A core array held across calls (lattice._core.held); ops take it where they take a capsule.")
      .def_property_readonly("data_ptr", [](const python::HeldArray& h) {
        return reinterpret_cast<std::uintptr_t>(h.array.raw_data());
      });
  m.def(
      "hold", [](const py::object& capsule) { return python::HeldArray{python::array_from_capsule(capsule, "array")}; },
      py::arg("capsule"), "A HeldArray of a DLPack capsule (consumes it): pass it to ops in place of a capsule.");
  python::bind_core(m);
  python::bind_conv(m);
  python::bind_quantize(m);
  python::bind_quantized(m);
  python::bind_io(m);
  python::bind_point_voxel(m);
  python::bind_pool(m);
  python::bind_algebra(m);
  python::bind_coords(m);
  python::bind_batch_norm(m);
}
