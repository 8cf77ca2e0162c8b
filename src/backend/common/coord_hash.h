// Coordinate hashing shared by host and device code. Keys are the full 128-bit row
// (batch, x, y, z) of int32 values: two different rows never compare equal, so no coordinate
// range restriction exists and collisions can only cost probes, never answers.
#pragma once

#include <cstdint>

#include "backend/common/geometry.h"

namespace lattice::geometry {

struct Coord4 {
  std::int32_t b, x, y, z;
};

LATTICE_HD bool operator==(const Coord4& a, const Coord4& c) {
  return a.b == c.b && a.x == c.x && a.y == c.y && a.z == c.z;
}

// 64-bit mix of the four int32 values (splitmix64 finaliser over two packed words).
LATTICE_HD std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
LATTICE_HD std::uint64_t hash_coord(const Coord4& c) {
  std::uint64_t lo = (static_cast<std::uint64_t>(static_cast<std::uint32_t>(c.x)) << 32) |
                     static_cast<std::uint32_t>(c.y);
  std::uint64_t hi = (static_cast<std::uint64_t>(static_cast<std::uint32_t>(c.b)) << 32) |
                     static_cast<std::uint32_t>(c.z);
  return mix64(lo ^ mix64(hi + 0x9e3779b97f4a7c15ULL));
}

// One slot of the CPU coordinate index (relation route cpu_hash, backend/cpu/relation/hash.cpp):
// the key beside its row (-1 = empty), so a probe reads one slot instead of following the row into
// the coordinate array.
struct HostCoordSlot {
  Coord4 key;
  std::int32_t row;
};
static_assert(sizeof(HostCoordSlot) == 5 * sizeof(std::int32_t), "a slot is five int32 values");

// Row of `c` in a CPU index (capacity mask + 1 slots, at most half full), or -1.
inline std::int64_t host_find(const HostCoordSlot* slots, std::uint64_t mask, const Coord4& c) {
  std::uint64_t h = hash_coord(c) & mask;
  while (true) {
    const HostCoordSlot& slot = slots[h];
    if (slot.row < 0) return -1;
    if (slot.key == c) return slot.row;
    h = (h + 1) & mask;
  }
}

}  // namespace lattice::geometry
