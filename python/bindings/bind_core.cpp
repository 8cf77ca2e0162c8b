// Core objects: coordinate sets (identity + relation cache), diagnostics.
#include "common.h"
#include "lattice/core/stream.h"
#include "lattice/core/threads.h"
#include "lattice/ops/diagnostics.h"
#include "lattice/tensor/coordinate_set.h"
#include "lattice/tensor/relation.h"

namespace lattice::python {

void bind_core(py::module_& m) {
  py::class_<CoordinateSet, std::shared_ptr<CoordinateSet>>(m, "CoordinateSet")
      .def_static(
          "create",
          [](const py::object& coords, const py::object& stride,
             std::optional<std::vector<std::int64_t>> batch_counts, bool validate) {
            Array c = array_from_capsule(coords, "coords");
            const Int3 s = to_int3(stride, "stride");
            py::gil_scoped_release release;
            return CoordinateSet::create(c, s, std::move(batch_counts), validate, "SparseTensor");
          },
          py::arg("coords"), py::arg("stride"), py::arg("batch_counts") = py::none(),
          py::arg("validate") = false)
      .def_property_readonly("key", &CoordinateSet::key)
      .def_property_readonly("size", &CoordinateSet::size)
      .def_property_readonly("stride", [](const CoordinateSet& s) {
        const Int3 v = s.stride();
        return py::make_tuple(v[0], v[1], v[2]);
      })
      .def_property_readonly("batch_counts", &CoordinateSet::batch_counts)
      .def("coords", [](const CoordinateSet& s) { return capsule_from_array(s.coords()); })
      .def("validate", [](const CoordinateSet& s, const std::string& op) {
        py::gil_scoped_release release;
        s.index(op);
      }, py::arg("op") = "SparseTensor")
      .def("lookup", &CoordinateSet::lookup, py::arg("b"), py::arg("x"), py::arg("y"), py::arg("z"),
           py::arg("op") = "lookup")
      .def_property_readonly("cached_relation_count", &CoordinateSet::cached_relation_count)
      .def_property_readonly("transposed_relation_count", &CoordinateSet::transposed_relation_count);

  py::class_<Relation, std::shared_ptr<Relation>>(m, "Relation")
      .def_property_readonly("kind", [](const Relation& r) { return std::string(to_string(r.kind)); })
      .def_readonly("n_in", &Relation::n_in)
      .def_readonly("n_out", &Relation::n_out)
      .def_readonly("kernel_volume", &Relation::kernel_volume)
      // Counted on first read (one read-back for a device relation whose count the geometry
      // does not fix), like every view below: built when first asked for.
      .def_property_readonly("n_edges", [](const Relation& r) { return r.n_edges(); })
      .def_readonly("identity", &Relation::identity)
      .def("arrays", [](const Relation& r) {
        py::dict d;
        d["in_idx"] = capsule_from_array(r.in_idx());
        d["out_idx"] = capsule_from_array(r.out_idx());
        d["k_idx"] = capsule_from_array(r.k_idx());
        d["out_ptr"] = capsule_from_array(r.out_ptr());
        d["k_ptr"] = capsule_from_array(r.k_ptr());
        d["k_in"] = capsule_from_array(r.k_in());
        d["k_out"] = capsule_from_array(r.k_out());
        return d;
      }, "Edge list (output-major) and views, as DLPack capsules (built on first request).")
      // The views that exist now (names) and the bytes they hold on the relation's device.
      .def("built_views", [](const Relation& r) {
        const unsigned v = r.built_views();
        py::list names;
        const std::pair<RelationView, const char*> all[] = {
            {kViewGemmMap, "gemm_map"}, {kViewEdgeList, "edge_list"}, {kViewOutPtr, "out_ptr"},
            {kViewOffsetGrouping, "offset_grouping"}, {kViewRowMasks, "row_masks"},
            {kViewInputGrouping, "input_grouping"}, {kViewInputGemmMap, "input_gemm_map"},
            {kViewGemmOrder, "gemm_order"}, {kViewInputGemmOrder, "input_gemm_order"},
            {kViewEdgeCount, "edge_count"}, {kViewHostKPtr, "host_k_ptr"}};
        for (const auto& [bit, name] : all)
          if (v & bit) names.append(name);
        return names;
      })
      .def_property_readonly("view_bytes", &Relation::view_bytes)
      // The edge count when known without counting (geometry, an earlier count), else None.
      .def_property_readonly("known_edges", [](const Relation& r) -> py::object {
        const std::int64_t e = r.known_edges();
        return e >= 0 ? py::object(py::int_(e)) : py::object(py::none());
      })
      .def("gemm_map", [](const Relation& r) { return capsule_from_array(r.gemm_map()); })
      .def("row_masks", [](const Relation& r) { return capsule_from_array(r.row_masks()); })
      .def("input_gemm_map", [](const Relation& r) { return capsule_from_array(r.input_gemm_map()); })
      // Whether the input side is the output side mirrored (submanifold relations).
      .def("mirrors_itself", &Relation::mirrors_itself)
      // Rows in mask order (int32), or None for kernel volumes above 64.
      .def("gemm_order", [](const Relation& r) -> py::object {
        const Array& a = r.gemm_order();
        return a.defined() ? py::object(capsule_from_array(a)) : py::object(py::none());
      })
      .def("input_gemm_order", [](const Relation& r) -> py::object {
        const Array& a = r.input_gemm_order();
        return a.defined() ? py::object(capsule_from_array(a)) : py::object(py::none());
      });

  m.def("set_current_stream", [](int device_index, std::uintptr_t stream) {
    set_current_stream(Device::cuda(device_index), stream);
  }, py::arg("device_index"), py::arg("stream"),
        "Sets this thread's stream for CUDA work on a device (a cudaStream_t as an integer).");
  m.def("current_stream", [](int device_index) { return current_stream(Device::cuda(device_index)); },
        py::arg("device_index"));
  m.def("backend_info", &backend_info);
  // The CUDA allocator's counters (all zero without CUDA) and its cache flush.
  m.def("cuda_memory_stats", [] {
    const DeviceMemoryStats st = device_memory_stats(DeviceType::cuda);
    py::dict d;
    d["driver_allocs"] = st.driver_allocs;
    d["driver_frees"] = st.driver_frees;
    d["cache_hits"] = st.cache_hits;
    d["live_bytes"] = st.live_bytes;
    d["cached_bytes"] = st.cached_bytes;
    d["host_syncs"] = st.host_syncs;
    d["graph_allocs"] = st.graph_allocs;
    return d;
  });
  m.def("cuda_empty_cache", [] {
    py::gil_scoped_release release;
    device_empty_cache(DeviceType::cuda);
  });
  // The route table's rows (src/route/<family>_routes.cpp): the one declaration of every route,
  // read by the docs generator and by the tests that iterate over routes.
  m.def("route_table", [] {
    py::list rows;
    for (const RouteInfo& r : route_table()) {
      py::list files;
      for (const KernelFile& f : r.files)
        if (!f.path.empty()) files.append(py::make_tuple(std::string(f.path), std::string(f.constraints)));
      py::dict d;
      d["family"] = std::string(r.family);
      d["name"] = std::string(r.name);
      d["device"] = std::string(r.device);
      d["tier"] = std::string(to_string(r.tier));
      d["rank"] = r.rank;
      d["kernels"] = std::string(r.kernels);
      d["files"] = files;
      rows.append(d);
    }
    return rows;
  });
  m.def("route_families", [] {
    std::vector<std::string> out;
    for (auto f : route_families()) out.emplace_back(f);
    return out;
  });
  m.def("route_names", [](const std::string& family) {
    std::vector<std::string> out;
    for (auto n : route_names(family)) out.emplace_back(n);
    return out;
  }, py::arg("family"));
  m.def("get_num_threads", &num_threads);
  m.def("set_num_threads", &set_num_threads, py::arg("n"));
  m.def("device_caps", [] {
    const DeviceCaps c = device_caps();
    py::dict cpu, cuda, out;
    cpu["threads"] = c.cpu.threads;
    cpu["isa"] = c.cpu.isa;
    cpu["blas"] = c.cpu.blas;
    cuda["built"] = c.cuda.built;
    cuda["device_count"] = c.cuda.device_count;
    cuda["sm"] = c.cuda.sm;
    cuda["tier"] = std::string(to_string(c.cuda.tier));
    cuda["name"] = c.cuda.name;
    cuda["status"] = c.cuda.status;
    cuda["sm_count"] = c.cuda.sm_count;
    cuda["shared_memory_per_block"] = c.cuda.shared_memory_per_block;
    out["cpu"] = cpu;
    out["cuda"] = cuda;
    return out;
  });
}

}  // namespace lattice::python
