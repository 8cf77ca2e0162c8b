// Open-addressing hash index over coordinate rows (internal to the tensor layer).
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

namespace lattice {

// The device coordinate kernels of `device` (a CUDA device); raises UnsupportedError naming `op`
// when this build has none ("built without CUDA").
const backend::DeviceCoordKernels& device_coord_kernels(Device device, std::string_view op);

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
  const backend::DeviceCoordTable* device_table() const { return on_device_ ? &device_table_ : nullptr; }

 private:
  bool on_device_ = false;
  backend::DeviceCoordTable device_table_;
  Array coords_;
  const geometry::Coord4* rows_ = nullptr;
  std::int64_t n_ = 0;
  std::uint64_t mask_ = 0;
  // Each slot keeps its key beside the row, so a probe reads one slot instead of following the
  // row into the coordinate array (one cache miss per probe instead of two).
  struct Slot {
    geometry::Coord4 key;
    std::int32_t row;  // -1 = empty
  };
  std::vector<Slot> slots_;
};

// Collects unique coordinates in first-occurrence order (used to generate output supports).
class UniqueCoordBuilder {
 public:
  explicit UniqueCoordBuilder(std::int64_t expected);
  // Row of `c` in the output, inserting it when new.
  std::int32_t insert(const geometry::Coord4& c);
  std::int64_t size() const { return static_cast<std::int64_t>(rows_.size()); }
  // (M, 4) int32.
  Array finish() const;

 private:
  void grow();
  std::vector<geometry::Coord4> rows_;
  std::vector<std::int32_t> slots_;
  std::uint64_t mask_ = 0;
};

}  // namespace lattice
