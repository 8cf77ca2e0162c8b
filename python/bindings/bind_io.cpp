// Point-cloud file readers (lattice/io/io.h). Columns cross as DLPack capsules of their bytes
// (u8, shape (N, count * itemsize)) plus the numpy type name; python/lattice/io.py views them.
#include "common.h"
#include "lattice/io/io.h"

namespace lattice::python {

namespace {

py::dict cloud_to_dict(const io::PointCloud& cloud) {
  py::list columns;
  for (const io::Column& c : cloud.columns)
    columns.append(py::make_tuple(c.name, std::string(io::to_string(c.type)), c.count,
                                  capsule_from_array(c.data)));
  py::list meta;
  for (const auto& [key, value] : cloud.meta) meta.append(py::make_tuple(key, value));
  py::dict d;
  d["format"] = cloud.format;
  d["num_points"] = cloud.num_points;
  d["width"] = cloud.width;
  d["height"] = cloud.height;
  d["columns"] = columns;
  d["meta"] = meta;
  return d;
}

io::Format format_named(const std::string& name) {
  if (name == "kitti") return io::Format::kitti;
  if (name == "las") return io::Format::las;
  if (name == "pcd") return io::Format::pcd;
  if (name == "ply") return io::Format::ply;
  throw ValueError("[read] format: expected 'kitti', 'las', 'pcd' or 'ply', got '" + name + "'");
}

}  // namespace

void bind_io(py::module_& m) {
  m.def("io_read_kitti", [](const std::string& path) {
    Array points;
    {
      py::gil_scoped_release release;
      points = io::read_kitti(path);
    }
    return capsule_from_array(points);
  });
  m.def("io_read_kitti_labels", [](const std::string& path) {
    io::KittiLabels labels;
    {
      py::gil_scoped_release release;
      labels = io::read_kitti_labels(path);
    }
    return py::make_tuple(capsule_from_array(labels.semantic), capsule_from_array(labels.instance));
  });
  m.def(
      "io_read",
      [](const std::string& path, const std::optional<std::string>& format) {
        std::optional<io::Format> f;
        if (format) f = format_named(*format);
        io::PointCloud cloud;
        {
          py::gil_scoped_release release;
          cloud = io::read_point_cloud(path, f);
        }
        return cloud_to_dict(cloud);
      },
      py::arg("path"), py::arg("format") = py::none());
}

}  // namespace lattice::python
