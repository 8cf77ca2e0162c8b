// Device hash table over coordinate rows: the one GPU home of coordinate hashing (keys and
// hash function from backend/common/coord_hash.h, shared with the CPU index).
//
// Keys are full (batch, x, y, z) int32 rows, compared exactly: any int32 coordinate is valid
// and two rows never alias (no packed key, so no widening is ever needed). A slot holds a row
// index into the keyed array; for equal keys the table keeps the SMALLEST row (integer atomics
// only, so the contents are independent of thread timing). That one rule gives:
//   - lookup: the row of a coordinate, or -1 (coordinates assumed unique) — table_find;
//   - duplicate detection: row r repeats an earlier row iff table_find(rows[r]) != r;
//   - first-occurrence dedup: candidate c is the first of its key iff table_find(cand[c]) == c,
//     so compacting those candidates in index order yields the unique rows in first-occurrence
//     order (SEMANTICS.md "Relations"), deterministically.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/common/coord_hash.h"
#include "lattice/core/array.h"

namespace lattice::backend::cuda {

using geometry::Coord4;

struct CoordTableView {
  const Coord4* rows = nullptr;    // the keyed rows
  std::int32_t* slots = nullptr;   // capacity entries: row index, -1 = empty
  std::uint64_t mask = 0;          // capacity - 1 (capacity a power of two >= 2 * rows)
};

__device__ inline std::int32_t table_find(const CoordTableView& t, const Coord4& c) {
  std::uint64_t h = geometry::hash_coord(c) & t.mask;
  while (true) {
    const std::int32_t r = t.slots[h];
    if (r < 0) return -1;
    if (t.rows[r] == c) return r;
    h = (h + 1) & t.mask;
  }
}

// Inserts row `row`, keeping the smallest row per key.
__device__ inline void table_insert_min(const CoordTableView& t, std::int32_t row) {
  const Coord4 c = t.rows[row];
  std::uint64_t h = geometry::hash_coord(c) & t.mask;
  while (true) {
    std::int32_t cur = atomicCAS(&t.slots[h], -1, row);
    if (cur < 0) return;  // claimed an empty slot
    if (t.rows[cur] == c) {
      // Same key: lower the slot to the smaller row (retry while another thread changes it).
      while (row < cur) {
        const std::int32_t seen = atomicCAS(&t.slots[h], cur, row);
        if (seen == cur) return;
        cur = seen;
      }
      return;
    }
    h = (h + 1) & t.mask;
  }
}

// Owns the slots of a table over `rows` (device memory, n rows < 2^31). The rows must outlive it.
struct CoordTable {
  Array slots;  // int32 (capacity)
  std::uint64_t mask = 0;
  const Coord4* rows = nullptr;
  std::int64_t n = 0;
  CoordTableView view() const {
    return {rows, slots.defined() ? slots.data<std::int32_t>() : nullptr, mask};
  }
};

// Builds the table on the current stream of `device` (no host synchronisation).
CoordTable build_coord_table(const Coord4* rows, std::int64_t n, Device device);

// Unique rows of `candidates` (n rows) in first-occurrence order, computed on the device.
// `unique`: (M, 4) int32; `inverse` (when requested): int32 (n), the unique row of each
// candidate. One host synchronisation (to read M).
struct UniqueRows {
  Array unique;
  Array inverse;
};
UniqueRows unique_first_occurrence(const Coord4* candidates, std::int64_t n, Device device,
                                   bool want_inverse);

// The smallest row that repeats an earlier row, with that earlier row, or {-1, -1} when all
// rows are unique (one host synchronisation).
struct DuplicatePair {
  std::int64_t row = -1;
  std::int64_t first = -1;
};
DuplicatePair find_duplicate(const CoordTable& table, Device device);

}  // namespace lattice::backend::cuda
