// Hash index over coordinate rows (internal to the tensor layer), built by the relation route
// (cpu_hash, cuda_hash: src/route/relation_routes.cpp).
//
// Keys are full (batch, x, y, z) int32 rows compared exactly (backend/common/coord_hash.h), so
// any int32 coordinate is accepted and no two rows can alias. Slots store the key and its row; the
// indexed array is kept alive by the index.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "backend/args.h"
#include "backend/common/coord_hash.h"
#include "backend/kernel_table.h"
#include "lattice/core/array.h"
#include "lattice/route/route.h"

namespace lattice {

// The relation route for `problem` (explain(problem, device_caps()).chosen: cpu_hash, cuda_hash)
// and its kernels. Raises UnsupportedError naming problem.op when no route is admitted (CUDA data
// in a build without CUDA).
const backend::RelationKernels& relation_kernels(const RelationProblem& problem);
// The relation problem of hashing `coords` (pass index) for `op`.
RelationProblem index_problem(const Array& coords, std::string_view op);

class CoordIndex {
 public:
  // coords: (N, 4) int32 contiguous, on the CPU or a CUDA device (a device hash table, built
  // there). Raises ValueError naming `op` and both rows when a row repeats:
  // "[op] coords: expected unique rows, got row 7 (0, 1, 2, 3) equal to row 2".
  static std::shared_ptr<const CoordIndex> build(const Array& coords, std::string_view op);

  // Row of `c`, or -1 (CPU indexes; a device index raises UnsupportedError).
  std::int64_t find(const geometry::Coord4& c) const;
  std::int64_t size() const { return n_; }
  const Array& coords() const { return coords_; }
  // The table of a device index (over coords()), or nullptr for a CPU index.
  const backend::DeviceCoordTable* device_table() const { return on_device_ ? &table_ : nullptr; }
  // The index's table on its device (the relation route's layout, backend/args.h).
  const backend::DeviceCoordTable& table() const { return table_; }

 private:
  bool on_device_ = false;
  backend::DeviceCoordTable table_;
  Array coords_;
  std::int64_t n_ = 0;
  const geometry::HostCoordSlot* host_slots_ = nullptr;  // CPU index: table_.slots
};

}  // namespace lattice
