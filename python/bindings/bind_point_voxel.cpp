// Point <-> voxel family: point grouping (voxelize), point -> voxel maps (devoxelize), their
// forward/backward kernels and route decisions; the pure route table for tests.
#include "common.h"
#include "lattice/core/error.h"
#include "lattice/ops/diagnostics.h"
#include "lattice/ops/point_voxel.h"

namespace lattice::python {

namespace {

PointReduction parse_reduction(const std::string& s) {
  for (auto r : {PointReduction::mean, PointReduction::sum, PointReduction::max})
    if (to_string(r) == s) return r;
  throw ValueError("[voxelize] reduction: expected 'mean', 'sum' or 'max', got '" + s + "'");
}

PointVoxelMode parse_mode(const std::string& s) {
  for (auto m : {PointVoxelMode::nearest, PointVoxelMode::trilinear})
    if (to_string(m) == s) return m;
  throw ValueError("[build_point_voxel_map] mode: expected 'nearest' or 'trilinear', got '" + s +
                   "'");
}

PointVoxelPass parse_pass(const std::string& op, const std::string& s) {
  for (auto p : {PointVoxelPass::forward, PointVoxelPass::backward, PointVoxelPass::build_map})
    if (to_string(p) == s) return p;
  throw ValueError("[" + op + "] pass: expected 'forward' or 'backward', got '" + s + "'");
}

std::array<double, 3> as3(const std::array<double, 3>& v) { return v; }

}  // namespace

void bind_point_voxel(py::module_& m) {
  py::class_<ops::PointGrouping, std::shared_ptr<ops::PointGrouping>>(m, "PointGrouping")
      .def_readonly("voxels", &ops::PointGrouping::voxels)
      .def_property_readonly("n_points", &ops::PointGrouping::n_points)
      .def_property_readonly("n_voxels", &ops::PointGrouping::n_voxels)
      .def("inverse", [](const ops::PointGrouping& g) { return capsule_from_array(g.inverse); })
      .def("counts", [](const ops::PointGrouping& g) { return capsule_from_array(g.counts); })
      .def("voxel_ptr", [](const ops::PointGrouping& g) { return capsule_from_array(g.voxel_ptr); })
      .def("point_idx",
           [](const ops::PointGrouping& g) { return capsule_from_array(g.point_idx); });

  py::class_<ops::PointVoxelMap, std::shared_ptr<ops::PointVoxelMap>>(m, "PointVoxelMap")
      .def_property_readonly(
          "mode", [](const ops::PointVoxelMap& p) { return std::string(to_string(p.mode)); })
      .def_readonly("normalize", &ops::PointVoxelMap::normalize)
      .def_readonly("voxel_key", &ops::PointVoxelMap::voxel_key)
      .def_readonly("n_points", &ops::PointVoxelMap::n_points)
      .def_readonly("n_voxels", &ops::PointVoxelMap::n_voxels)
      .def_property_readonly("stride",
                             [](const ops::PointVoxelMap& p) {
                               return py::make_tuple(p.stride[0], p.stride[1], p.stride[2]);
                             })
      .def_property_readonly("voxel_size",
                             [](const ops::PointVoxelMap& p) { return as3(p.voxel_size); })
      .def_property_readonly("origin", [](const ops::PointVoxelMap& p) { return as3(p.origin); })
      .def("indices", [](const ops::PointVoxelMap& p) { return capsule_from_array(p.indices); })
      .def("weights", [](const ops::PointVoxelMap& p) { return capsule_from_array(p.weights); })
      .def("voxel_ptr", [](const ops::PointVoxelMap& p) { return capsule_from_array(p.voxel_ptr); })
      .def("entries", [](const ops::PointVoxelMap& p) { return capsule_from_array(p.entries); });

  m.def(
      "group_points",
      [](const py::object& points, std::array<double, 3> voxel_size, std::array<double, 3> origin,
         const py::object& batch, const std::string& op) {
        Array p = array_from_capsule(points, "points");
        std::optional<Array> b = optional_array(batch, "batch_indices");
        ops::QuantizeOptions o;
        o.voxel_size = voxel_size;
        o.origin = origin;
        py::gil_scoped_release release;
        return std::make_shared<ops::PointGrouping>(ops::group_points(p, o, b ? &*b : nullptr, op));
      },
      py::arg("points"), py::arg("voxel_size"), py::arg("origin"), py::arg("batch_indices"),
      py::arg("op") = "voxelize");

  m.def(
      "voxelize_forward",
      [](const ops::PointGrouping& g, const py::object& feats, const std::string& reduction,
         const std::optional<std::string>& route) {
        Array x = array_from_capsule(feats, "feats");
        const PointReduction r = parse_reduction(reduction);
        const RoutePolicy policy = parse_policy("voxelize", "point_voxel", route);
        ops::VoxelizeForward out;
        {
          py::gil_scoped_release release;
          out = ops::voxelize_forward(g, x, r, policy);
        }
        return py::make_tuple(capsule_from_array(out.feats), capsule_or_none(out.argmax));
      },
      py::arg("grouping"), py::arg("feats"), py::arg("reduction"), py::arg("route") = py::none());

  m.def(
      "voxelize_backward",
      [](const ops::PointGrouping& g, const py::object& grad_out, const py::object& argmax,
         const std::string& reduction, const std::optional<std::string>& route) {
        Array dy = array_from_capsule(grad_out, "grad_out");
        std::optional<Array> arg = optional_array(argmax, "argmax");
        const PointReduction r = parse_reduction(reduction);
        const RoutePolicy policy = parse_policy("voxelize", "point_voxel", route);
        Array dx;
        {
          py::gil_scoped_release release;
          dx = ops::voxelize_backward(g, dy, arg ? *arg : Array(), r, policy);
        }
        return capsule_from_array(dx);
      },
      py::arg("grouping"), py::arg("grad_out"), py::arg("argmax"), py::arg("reduction"),
      py::arg("route") = py::none());

  m.def(
      "build_point_voxel_map",
      [](const py::object& points, const std::shared_ptr<CoordinateSet>& voxels,
         std::array<double, 3> voxel_size, std::array<double, 3> origin, const std::string& mode,
         bool normalize, const py::object& batch, const std::optional<std::string>& route) {
        Array p = array_from_capsule(points, "points");
        std::optional<Array> b = optional_array(batch, "batch_indices");
        ops::PointVoxelMapOptions o;
        o.voxel_size = voxel_size;
        o.origin = origin;
        o.mode = parse_mode(mode);
        o.normalize = normalize;
        o.policy = parse_policy("build_point_voxel_map", "point_voxel", route);
        py::gil_scoped_release release;
        return std::const_pointer_cast<ops::PointVoxelMap>(
            ops::build_point_voxel_map(p, voxels, o, b ? &*b : nullptr));
      },
      py::arg("points"), py::arg("voxels"), py::arg("voxel_size"), py::arg("origin"),
      py::arg("mode"), py::arg("normalize"), py::arg("batch_indices"),
      py::arg("route") = py::none());

  m.def(
      "devoxelize_forward",
      [](const ops::PointVoxelMap& map, const std::shared_ptr<CoordinateSet>& voxels,
         const py::object& feats, const std::optional<std::string>& route) {
        Array x = array_from_capsule(feats, "feats");
        const RoutePolicy policy = parse_policy("devoxelize", "point_voxel", route);
        Array y;
        {
          py::gil_scoped_release release;
          y = ops::devoxelize_forward(map, voxels, x, policy);
        }
        return capsule_from_array(y);
      },
      py::arg("map"), py::arg("voxels"), py::arg("feats"), py::arg("route") = py::none());

  m.def(
      "devoxelize_backward",
      [](const ops::PointVoxelMap& map, const py::object& grad_out,
         const std::optional<std::string>& route) {
        Array dy = array_from_capsule(grad_out, "grad_out");
        const RoutePolicy policy = parse_policy("devoxelize", "point_voxel", route);
        Array dv;
        {
          py::gil_scoped_release release;
          dv = ops::devoxelize_backward(map, dy, policy);
        }
        return capsule_from_array(dv);
      },
      py::arg("map"), py::arg("grad_out"), py::arg("route") = py::none());

  m.def(
      "explain_voxelize",
      [](const ops::PointGrouping& g, const py::object& feats, const std::string& reduction,
         const std::string& pass, const std::optional<std::string>& route) {
        return ops::explain_voxelize(g, array_from_capsule(feats, "feats"),
                                     parse_reduction(reduction), parse_pass("voxelize", pass),
                                     parse_policy("voxelize", "point_voxel", route));
      },
      py::arg("grouping"), py::arg("feats"), py::arg("reduction"), py::arg("pass_") = "forward",
      py::arg("route") = py::none());

  m.def(
      "explain_devoxelize",
      [](const ops::PointVoxelMap& map, const py::object& feats, const std::string& pass,
         const std::optional<std::string>& route) {
        return ops::explain_devoxelize(map, array_from_capsule(feats, "feats"),
                                       parse_pass("devoxelize", pass),
                                       parse_policy("devoxelize", "point_voxel", route));
      },
      py::arg("map"), py::arg("feats"), py::arg("pass_") = "forward",
      py::arg("route") = py::none());

  m.def(
      "explain_build_point_voxel_map",
      [](const py::object& points, const std::shared_ptr<CoordinateSet>& voxels,
         const std::string& mode, const std::optional<std::string>& route) {
        return ops::explain_build_point_voxel_map(array_from_capsule(points, "points"), voxels,
                                                  parse_mode(mode),
                                                  parse_policy("build_point_voxel_map", "point_voxel", route));
      },
      py::arg("points"), py::arg("voxels"), py::arg("mode"), py::arg("route") = py::none());

  // The pure route table on a described problem: keys op, pass, dtype ('float32', ...),
  // device ('cpu', 'cuda:0'), n_points, n_voxels, channels.
  m.def(
      "explain_point_voxel_problem",
      [](const py::dict& problem, const std::optional<std::string>& route) {
        PointVoxelProblem p;
        p.op = problem.contains("op") ? problem["op"].cast<std::string>() : "voxelize";
        if (problem.contains("pass"))
          p.pass = parse_pass(p.op, problem["pass"].cast<std::string>());
        if (problem.contains("dtype")) {
          const auto d = problem["dtype"].cast<std::string>();
          bool found = false;
          for (auto t : {Dtype::f16, Dtype::bf16, Dtype::f32, Dtype::f64, Dtype::i32, Dtype::i64})
            if (to_string(t) == d) {
              p.dtype = t;
              found = true;
            }
          if (!found)
            throw ValueError("[explain] dtype: expected a dtype name like 'float32', got '" + d +
                             "'");
        }
        if (problem.contains("device")) {
          const auto d = problem["device"].cast<std::string>();
          p.device =
              d == "cpu" ? Device::cpu() : Device::cuda(d.size() > 5 ? std::stoi(d.substr(5)) : 0);
        }
        auto get = [&](const char* k) {
          return problem.contains(k) ? problem[k].cast<std::int64_t>() : 0;
        };
        p.n_points = get("n_points");
        p.n_voxels = get("n_voxels");
        p.channels = get("channels");
        return explain(p, device_caps(), parse_policy(p.op, "point_voxel", route));
      },
      py::arg("problem"), py::arg("route") = py::none());
}

}  // namespace lattice::python
