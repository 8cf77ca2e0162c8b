// CoordIndex: the coordinate index of a set, built by the relation route the route layer chooses
// (cpu_hash: src/backend/cpu/relation/hash.cpp, cuda_hash: src/backend/cuda/relation/hash.cu).
#include "tensor/coord_index.h"

#include <string>

#include "lattice/core/error.h"

namespace lattice {

namespace {

// "[op] coords: expected unique rows, got row 7 (0, 1, 2, 3) equal to row 2". Built by appending
// (GCC 12 reports a false -Wrestrict on `"literal" + std::string` chains).
[[noreturn]] void throw_duplicate(std::string_view op, std::int64_t row, const geometry::Coord4& c,
                                  std::int64_t first) {
  std::string got = "row ";
  got += std::to_string(row);
  got += " (";
  for (std::int32_t v : {c.b, c.x, c.y, c.z}) {
    if (got.back() != '(') got += ", ";
    got += std::to_string(v);
  }
  got += ") equal to row ";
  got += std::to_string(first);
  throw_value_error(op, "coords", "unique rows", got);
}

}  // namespace

RelationProblem index_problem(const Array& coords, std::string_view op) {
  RelationProblem p;
  p.op = std::string(op);
  p.pass = RelationPass::index;
  p.device = coords.device();
  p.n_rows = coords.defined() && coords.ndim() >= 1 ? coords.dim(0) : 0;
  return p;
}

const backend::RelationKernels& relation_kernels(const RelationProblem& problem) {
  const DeviceCaps caps = backend::device_caps();
  const std::optional<RouteId> chosen = select(problem, caps);
  const backend::RelationKernels* kernels = chosen ? backend::find_relation_kernels(*chosen) : nullptr;
  if (!kernels) {
    const Explanation e = explain(problem, caps);
    const std::string device = to_string(problem.device);
    if (problem.device.is_cuda() && !caps.cuda.built) {
      throw UnsupportedError("[" + problem.op + "] coords: expected cpu coordinates (" + device +
                             " needs the CUDA backend), got " + device + " (built without CUDA)");
    }
    throw UnsupportedError("[" + problem.op + "] coords: expected coordinates on a device a relation route admits, got " +
                           device + "\n" + e.to_string());
  }
  return *kernels;
}

std::shared_ptr<const CoordIndex> CoordIndex::build(const Array& coords, std::string_view op) {
  LATTICE_ASSERT(coords.dtype() == Dtype::i32 && coords.ndim() == 2 && coords.dim(1) == 4 &&
                     coords.is_contiguous(),
                 "CoordIndex::build needs contiguous (N, 4) int32 coordinates");
  const std::int64_t n = coords.dim(0);
  if (n > geometry::kInt32Max) {
    throw_value_error(op, "coords", "fewer than 2^31 rows", std::to_string(n) + " rows");
  }
  // The smallest row that repeats an earlier one and that earlier row, on every route (CPU:
  // sequential insertion; device: each key keeps its smallest row).
  const backend::RelationKernels& kernels = relation_kernels(index_problem(coords, op));
  auto index = std::make_shared<CoordIndex>();
  index->coords_ = coords;
  index->n_ = n;
  index->on_device_ = !coords.device().is_cpu();
  index->table_ = kernels.build_table(coords);
  const backend::DuplicateRow dup = kernels.find_duplicate(coords, index->table_);
  if (dup.row >= 0) throw_duplicate(op, dup.row, dup.value, dup.first);
  if (!index->on_device_) {
    index->host_slots_ = reinterpret_cast<const geometry::HostCoordSlot*>(index->table_.slots.data<std::int32_t>());
  }
  return index;
}

std::int64_t CoordIndex::find(const geometry::Coord4& c) const {
  if (on_device_) [[unlikely]] {
    throw UnsupportedError("[lookup] coords: expected a cpu coordinate index, got one on " +
                           to_string(coords_.device()));
  }
  return geometry::host_find(host_slots_, table_.mask, c);
}

}  // namespace lattice
