// Coordinate utilities: union / intersection / lookup by value, downsampling, Morton codes.
#include <array>
#include <cstring>
#include <vector>

#include "common.h"
#include "lattice/core/error.h"
#include "lattice/ops/coords.h"

namespace lattice::python {

namespace {

using SetPtr = std::shared_ptr<CoordinateSet>;

}  // namespace

void bind_coords(py::module_& m) {
  m.def(
      "union_coords",
      [](const SetPtr& a, const SetPtr& b, const std::optional<std::string>& route) {
        const RoutePolicy p = parse_policy("union_coords", "algebra", route);
        Array out;
        {
          py::gil_scoped_release release;
          out = ops::union_coords(a, b, p);
        }
        return capsule_from_array(out);
      },
      py::arg("a"), py::arg("b"), py::arg("route") = py::none());
  m.def(
      "intersection_coords",
      [](const SetPtr& a, const SetPtr& b, const std::optional<std::string>& route) {
        const RoutePolicy p = parse_policy("intersection_coords", "algebra", route);
        Array out;
        {
          py::gil_scoped_release release;
          out = ops::intersection_coords(a, b, p);
        }
        return capsule_from_array(out);
      },
      py::arg("a"), py::arg("b"), py::arg("route") = py::none());
  m.def(
      "lookup_coords",
      [](const SetPtr& table, const py::object& queries, bool as_bool,
         const std::optional<std::string>& route) {
        const char* op = as_bool ? "contains_coords" : "lookup_coords";
        const RoutePolicy p = parse_policy(op, "algebra", route);
        Array q = array_from_capsule(queries, "queries");
        Array out;
        {
          py::gil_scoped_release release;
          out = as_bool ? ops::contains_coords(table, q, p) : ops::lookup_coords(table, q, p);
        }
        if (as_bool) {
          // DLPack's bool code is newer than some consumers (torch 1.13): cross as uint8 (0/1), the
          // Python side views it as bool. A device result is copied through the host (memcpy on
          // device memory segfaults) and goes back to its device.
          const Device device = out.device();
          const Array host = device.is_cpu() ? out : out.to(Device::cpu());
          Array bytes = Array::empty({host.dim(0)}, Dtype::u8);
          if (host.dim(0) > 0)
            std::memcpy(bytes.raw_data(), host.raw_data(), static_cast<std::size_t>(host.dim(0)));
          out = device.is_cpu() ? bytes : bytes.to(device);
        }
        return capsule_from_array(out);
      },
      py::arg("table"), py::arg("queries"), py::arg("as_bool") = false,
      py::arg("route") = py::none());
  m.def(
      "downsample_coords",
      [](const py::object& coords, const py::object& stride,
         const std::optional<std::string>& route) {
        Array c = array_from_capsule(coords, "coords");
        const Int3 s = to_int3(stride, "stride");
        const RoutePolicy p = parse_policy("downsample_coords", "coords", route);
        ops::DownsampleOutput out;
        {
          py::gil_scoped_release release;
          out = ops::downsample_coords(c, s, p);
        }
        return py::make_tuple(capsule_from_array(out.coords), capsule_from_array(out.inverse));
      },
      py::arg("coords"), py::arg("stride"), py::arg("route") = py::none());
  m.def(
      "morton",
      [](const py::object& coords, bool order, const std::optional<std::string>& route) {
        const char* op = order ? "morton_order" : "morton_codes";
        Array c = array_from_capsule(coords, "coords");
        const RoutePolicy p = parse_policy(op, "coords", route);
        Array out;
        {
          py::gil_scoped_release release;
          out = order ? ops::morton_order(c, p) : ops::morton_codes(c, p);
        }
        return capsule_from_array(out);
      },
      py::arg("coords"), py::arg("order"), py::arg("route") = py::none());
  m.def(
      "explain_coords",
      [](const std::string& op, const py::object& coords) {
        return ops::explain_coords(op, array_from_capsule(coords, "coords"));
      },
      py::arg("op"), py::arg("coords"));
  m.def(
      "explain_coords_rows",
      [](const std::string& op, std::int64_t n_rows, const std::string& d) {
        const Device device = d == "cpu" ? Device::cpu() : Device::cuda(d.size() > 5 ? std::stoi(d.substr(5)) : 0);
        return ops::explain_coords(op, n_rows, device);
      },
      py::arg("op"), py::arg("n_rows"), py::arg("device") = "cpu");
  // prune / crop: the kept rows (K) int64 of coords (N, 4); mask (N) uint8 (0/1) for prune.
  m.def(
      "prune_rows",
      [](const py::object& coords, const py::object& mask) {
        Array c = array_from_capsule(coords, "coords");
        Array k = array_from_capsule(mask, "mask");
        Array out;
        {
          py::gil_scoped_release release;
          out = ops::prune_rows(c, k);
        }
        return capsule_from_array(out);
      },
      py::arg("coords"), py::arg("mask"));
  m.def(
      "crop_rows",
      [](const py::object& coords, const py::object& lo, const py::object& hi) {
        Array c = array_from_capsule(coords, "coords");
        const Int3 l = to_int3(lo, "lo"), h = to_int3(hi, "hi");
        Array out;
        {
          py::gil_scoped_release release;
          out = ops::crop_rows(c, l, h);
        }
        return capsule_from_array(out);
      },
      py::arg("coords"), py::arg("lo"), py::arg("hi"));
  // sparse_collate: (coords (sum N_i, 4) int32, counts list).
  m.def(
      "collate_coords",
      [](const py::list& samples) {
        std::vector<Array> arrays;
        for (std::size_t i = 0; i < samples.size(); ++i)
          arrays.push_back(array_from_capsule(samples[i], "samples"));
        ops::CollateOutput out;
        {
          py::gil_scoped_release release;
          out = ops::collate_coords(arrays);
        }
        return py::make_tuple(capsule_from_array(out.coords), py::cast(out.counts));
      },
      py::arg("samples"));
  m.def(
      "dense_index",
      [](const py::object& coords, const py::object& origin, std::array<std::int64_t, 3> size) {
        Array c = array_from_capsule(coords, "coords");
        const Int3 o = to_int3(origin, "origin");
        Array out;
        {
          py::gil_scoped_release release;
          out = ops::dense_index(c, o, size);
        }
        return capsule_from_array(out);
      },
      py::arg("coords"), py::arg("origin"), py::arg("size"));
  // from_dense: (coords (K, 4) int32, flat cells (K) int64, counts list) of a (B, X, Y, Z)
  // uint8 mask.
  m.def(
      "nonzero_sites",
      [](const py::object& site, const py::object& origin) {
        Array s = array_from_capsule(site, "dense");
        const Int3 o = to_int3(origin, "origin");
        ops::NonzeroOutput out;
        {
          py::gil_scoped_release release;
          out = ops::nonzero_sites(s, o);
        }
        return py::make_tuple(capsule_from_array(out.coords), capsule_from_array(out.index),
                              py::cast(out.counts));
      },
      py::arg("site"), py::arg("origin"));
  m.def(
      "explain_lookup",
      [](const std::string& op, const SetPtr& table, std::int64_t n_queries) {
        return ops::explain_lookup(op, *table, n_queries);
      },
      py::arg("op"), py::arg("table"), py::arg("n_queries"));
}

}  // namespace lattice::python
