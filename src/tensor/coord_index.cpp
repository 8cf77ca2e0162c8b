// CoordIndex and UniqueCoordBuilder: open addressing with linear probing over full
// (batch, x, y, z) rows; slots hold a row number or -1 and the table is kept at most half full,
// so every probe sequence reaches an empty slot.
#include "tensor/coord_index.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <string>

#include "lattice/core/error.h"

namespace lattice {

namespace {

static_assert(sizeof(geometry::Coord4) == 4 * sizeof(std::int32_t),
              "Coord4 must alias one (batch, x, y, z) int32 row");

// Smallest power of two >= max(2 * n, minimum).
std::uint64_t table_capacity(std::int64_t n, std::uint64_t minimum) {
  return std::bit_ceil(std::max(static_cast<std::uint64_t>(n) * 2, minimum));
}

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

const backend::DeviceCoordKernels& device_coord_kernels(Device device, std::string_view op) {
  const backend::DeviceCoordKernels* kernels = backend::find_device_coord_kernels(device);
  if (!kernels) {
    throw UnsupportedError("[" + std::string(op) + "] coords: expected cpu coordinates (" + to_string(device) +
                           " needs the CUDA backend), got " + to_string(device) + " (built without CUDA)");
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
  if (!coords.device().is_cpu()) {
    // Device table: each key keeps its smallest row, so the smallest row that repeats an earlier
    // one and that earlier row are found exactly as by the sequential insertion below.
    const backend::DeviceCoordKernels& kernels = device_coord_kernels(coords.device(), op);
    auto index = std::make_shared<CoordIndex>();
    index->coords_ = coords;
    index->n_ = n;
    index->on_device_ = true;
    index->device_table_ = kernels.build_table(coords);
    const backend::DuplicateRow dup = kernels.find_duplicate(coords, index->device_table_);
    if (dup.row >= 0) throw_duplicate(op, dup.row, dup.value, dup.first);
    return index;
  }

  auto index = std::make_shared<CoordIndex>();
  index->coords_ = coords;
  index->rows_ = reinterpret_cast<const geometry::Coord4*>(coords.data<std::int32_t>());
  index->n_ = n;
  const std::uint64_t capacity = table_capacity(n, 1);
  index->mask_ = capacity - 1;
  index->slots_.assign(capacity, Slot{{0, 0, 0, 0}, -1});

  // Sequential insertion in row order, so a duplicate is always reported as the first row that
  // repeats an earlier one (deterministic message).
  const geometry::Coord4* rows = index->rows_;
  Slot* slots = index->slots_.data();
  for (std::int64_t r = 0; r < n; ++r) {
    std::uint64_t h = geometry::hash_coord(rows[r]) & index->mask_;
    while (slots[h].row >= 0) {
      if (slots[h].key == rows[r]) throw_duplicate(op, r, rows[r], slots[h].row);
      h = (h + 1) & index->mask_;
    }
    slots[h] = Slot{rows[r], static_cast<std::int32_t>(r)};
  }
  return index;
}

std::int64_t CoordIndex::find(const geometry::Coord4& c) const {
  if (on_device_) [[unlikely]] {
    throw UnsupportedError("[lookup] coords: expected a cpu coordinate index, got one on " +
                           to_string(coords_.device()));
  }
  std::uint64_t h = geometry::hash_coord(c) & mask_;
  while (true) {
    const Slot& slot = slots_[h];
    if (slot.row < 0) return -1;
    if (slot.key == c) return slot.row;
    h = (h + 1) & mask_;
  }
}

UniqueCoordBuilder::UniqueCoordBuilder(std::int64_t expected) {
  const std::int64_t n = std::max<std::int64_t>(expected, 0);
  rows_.reserve(static_cast<std::size_t>(n));
  const std::uint64_t capacity = table_capacity(n, 16);
  mask_ = capacity - 1;
  slots_.assign(capacity, -1);
}

std::int32_t UniqueCoordBuilder::insert(const geometry::Coord4& c) {
  std::uint64_t h = geometry::hash_coord(c) & mask_;
  while (slots_[h] >= 0) {
    if (rows_[slots_[h]] == c) return slots_[h];
    h = (h + 1) & mask_;
  }
  LATTICE_ASSERT(size() <= geometry::kInt32Max, "UniqueCoordBuilder: more than 2^31 rows");
  const auto row = static_cast<std::int32_t>(rows_.size());
  rows_.push_back(c);
  slots_[h] = row;
  if (static_cast<std::uint64_t>(rows_.size()) * 2 > slots_.size()) grow();
  return row;
}

void UniqueCoordBuilder::grow() {
  const std::uint64_t capacity = slots_.size() * 2;
  mask_ = capacity - 1;
  slots_.assign(capacity, -1);
  for (std::size_t r = 0; r < rows_.size(); ++r) {
    std::uint64_t h = geometry::hash_coord(rows_[r]) & mask_;
    while (slots_[h] >= 0) h = (h + 1) & mask_;
    slots_[h] = static_cast<std::int32_t>(r);
  }
}

Array UniqueCoordBuilder::finish() const {
  Array out = Array::empty({size(), 4}, Dtype::i32);
  if (!rows_.empty()) std::memcpy(out.raw_data(), rows_.data(), rows_.size() * sizeof(rows_[0]));
  return out;
}

}  // namespace lattice
