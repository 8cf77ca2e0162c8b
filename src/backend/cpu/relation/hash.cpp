// Constraints: CPU; contiguous (N, 4) int32 coordinate rows, any int32 values, fewer than 2^31
// rows (checked by the tensor layer); every relation kind, any kernel volume, any row count
// (including none). Deterministic: bitwise-identical results for any thread count (the index is
// built by sequential insertion in row order, supports in first-occurrence order).
//
// The coordinate index: open addressing with linear probing over full (batch, x, y, z) rows;
// slots hold the key beside its row (geometry::HostCoordSlot) and the table is kept at most half
// full, so every probe sequence reaches an empty slot. Supports (SEMANTICS.md "Relations"):
// unique candidates in first-occurrence order, input row major, then kernel row. Edges: the
// (n_out, K) map by the gather rule c_i = o*s + off_k - p or the scatter rule o = c_i*s + off_k - p
// (the relation's stored view); on request, compacted into the output-major list and grouped per
// offset by a stable counting sort.
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <utility>
#include <vector>

#include "backend/common/coord_hash.h"
#include "backend/common/geometry.h"
#include "backend/kernels.h"
#include "lattice/core/error.h"
#include "lattice/core/threads.h"

namespace lattice::backend::cpu {

namespace {

using geometry::Coord4;
using geometry::HostCoordSlot;
using Offset = std::array<std::int64_t, 3>;
using Triple64 = std::array<std::int64_t, 3>;

// Loops over fewer (output, kernel row) pairs than this run on the calling thread: waking an
// OpenMP team costs microseconds (and whole scheduler slices when the cores are oversubscribed),
// a pair costs tens of nanoseconds. Order-of-magnitude estimate, not a benchmarked optimum.
constexpr std::int64_t kMinParallelPairs = std::int64_t{1} << 15;

// Smallest power of two >= max(2 * n, minimum).
std::uint64_t table_capacity(std::int64_t n, std::uint64_t minimum) {
  return std::bit_ceil(std::max(static_cast<std::uint64_t>(n) * 2, minimum));
}

std::int64_t spatial(const Coord4& c, int axis) {
  return axis == 0 ? c.x : (axis == 1 ? c.y : c.z);
}

const Coord4* rows_of(const Array& coords) {
  return reinterpret_cast<const Coord4*>(coords.data<std::int32_t>());
}

std::vector<Offset> kernel_offsets(const KernelSpec& spec, bool centered, std::int64_t K) {
  std::vector<Offset> offsets(static_cast<std::size_t>(K));
  for (std::int64_t k = 0; k < K; ++k) geometry::kernel_offset(k, spec, centered, offsets[k].data());
  return offsets;
}

std::int64_t volume(const KernelSpec& spec) {
  return static_cast<std::int64_t>(spec.size[0]) * spec.size[1] * spec.size[2];
}

// Collects unique coordinates in first-occurrence order (generated output supports).
class UniqueCoordBuilder {
 public:
  explicit UniqueCoordBuilder(std::int64_t expected) {
    const std::int64_t n = std::max<std::int64_t>(expected, 0);
    rows_.reserve(static_cast<std::size_t>(n));
    const std::uint64_t capacity = table_capacity(n, 16);
    mask_ = capacity - 1;
    slots_.assign(capacity, -1);
  }
  // Row of `c` in the output, inserting it when new.
  std::int32_t insert(const Coord4& c) {
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
  std::int64_t size() const { return static_cast<std::int64_t>(rows_.size()); }
  // (M, 4) int32.
  Array finish() const {
    Array out = Array::empty({size(), 4}, Dtype::i32);
    if (!rows_.empty()) std::memcpy(out.raw_data(), rows_.data(), rows_.size() * sizeof(rows_[0]));
    return out;
  }

 private:
  void grow() {
    const std::uint64_t capacity = slots_.size() * 2;
    mask_ = capacity - 1;
    slots_.assign(capacity, -1);
    for (std::size_t r = 0; r < rows_.size(); ++r) {
      std::uint64_t h = geometry::hash_coord(rows_[r]) & mask_;
      while (slots_[h] >= 0) h = (h + 1) & mask_;
      slots_[h] = static_cast<std::int32_t>(r);
    }
  }
  std::vector<Coord4> rows_;
  std::vector<std::int32_t> slots_;
  std::uint64_t mask_ = 0;
};

// Records the first candidate leaving int32 (input row i, value v); false when one was recorded.
bool in_range(DeviceSupportResult& r, std::int64_t v, std::int64_t i) {
  if (geometry::fits_int32(v)) return true;
  r.overflow_row = i;
  r.overflow_value = v;
  return false;
}

std::int64_t count_row(const std::int32_t* row, std::int64_t K) {
  std::int64_t count = 0;
  for (std::int64_t k = 0; k < K; ++k) count += row[k] >= 0;
  return count;
}

// K == 1 onto as many rows as the input has, and every row reaching itself.
bool is_identity(const Array& map, std::int64_t n_in) {
  const std::int64_t n_out = map.dim(0);
  if (map.dim(1) != 1 || n_in != n_out) return false;
  const std::int32_t* m = map.data<std::int32_t>();
  for (std::int64_t o = 0; o < n_out; ++o) {
    if (m[o] != o) return false;
  }
  return true;
}

// The input-side grouping: per offset, the (input, output) pairs sorted by input row. Within
// one offset every input row occurs at most once, so this is a total order and the result does
// not depend on the thread count. An offset whose inputs already ascend (common: the rows of a
// cloud in scan order keep their order under one offset) is copied without sorting.
// (Tried for issue 17: a counting sort through an (n_in, K) inverse map; 3x slower on MinkUNet42's
// relations than these mostly-sorted comparison sorts, see docs/performance.md.)
void sort_input_grouping(const std::int64_t* kp, const std::int32_t* src_in, const std::int32_t* src_out,
                         std::int64_t K, std::int64_t n_edges, std::int32_t* dst_in, std::int32_t* dst_out) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads()) if (n_edges >= kMinParallelPairs)
  for (std::int64_t k = 0; k < K; ++k) {
    const std::int64_t b = kp[k], n = kp[k + 1] - kp[k];
    if (std::is_sorted(src_in + b, src_in + b + n)) {
      std::copy(src_in + b, src_in + b + n, dst_in + b);
      std::copy(src_out + b, src_out + b + n, dst_out + b);
      continue;
    }
    std::vector<std::pair<std::int32_t, std::int32_t>> pairs(static_cast<std::size_t>(n));
    for (std::int64_t e = 0; e < n; ++e) pairs[static_cast<std::size_t>(e)] = {src_in[b + e], src_out[b + e]};
    std::sort(pairs.begin(), pairs.end());
    for (std::int64_t e = 0; e < n; ++e) {
      dst_in[b + e] = pairs[static_cast<std::size_t>(e)].first;
      dst_out[b + e] = pairs[static_cast<std::size_t>(e)].second;
    }
  }
}

// True when the gather rule maps the input onto itself symmetrically: output rows == input rows
// (a submanifold relation), stride 1, no padding, and antisymmetric offsets
// (off[K-1-k] == -off[k], as for every centred odd kernel, dilated or not). Then the edge
// (o, k, i) exists iff (i, K-1-k, o) does, and half of the probes determine the whole map.
bool mirrors_itself(const DeviceEdgeArgs& args, const std::vector<Offset>& offsets) {
  const Triple64& s = args.stride;
  const Triple64& p = args.padding;
  if (s != Triple64{1, 1, 1} || p != Triple64{0, 0, 0}) return false;
  const std::int64_t K = static_cast<std::int64_t>(offsets.size());
  for (std::int64_t k = 0; k < K; ++k) {
    const Offset& a = offsets[static_cast<std::size_t>(k)];
    const Offset& b = offsets[static_cast<std::size_t>(K - 1 - k)];
    if (a[0] != -b[0] || a[1] != -b[1] || a[2] != -b[2]) return false;
  }
  const std::int64_t n = args.input.dim(0);
  if (args.output.dim(0) != n) return false;
  const void* in = args.input.data<std::int32_t>();
  const void* out = args.output.data<std::int32_t>();
  // n == 0 first: memcmp of zero bytes with a null pointer (an empty array) is undefined
  return n == 0 || in == out || std::memcmp(in, out, static_cast<std::size_t>(n) * sizeof(Coord4)) == 0;
}

// The (n, K) map of a relation for which mirrors_itself holds, bitwise the one the general
// loop builds: offsets k < K/2 are probed, (i, K-1-k) is set to o for every edge (o, k, i)
// found, and an odd kernel's centre (offset 0) is the row itself. Every cell of the upper half
// is written by at most one o (coordinates are unique), so the parallel loop has no races; the
// upper half starts at -1 (cells no mirror reaches have no edge: c_j - off_k would equal some
// c_o + off_k, whose probe would have found j).
void fill_mirrored_map(const DeviceEdgeArgs& args, const std::vector<Offset>& offsets,
                       const HostCoordSlot* slots, std::uint64_t mask, std::int32_t* m) {
  const std::int64_t K = static_cast<std::int64_t>(offsets.size());
  const std::int64_t n = args.output.dim(0);
  const std::int64_t half = K / 2;
  const bool odd = K % 2 == 1;
  const Coord4* rows = rows_of(args.output);
  const bool parallel = n * K >= kMinParallelPairs;
#pragma omp parallel num_threads(num_threads()) if (parallel)
  {
#pragma omp for schedule(static)
    for (std::int64_t o = 0; o < n; ++o) {
      std::int32_t* row = m + o * K;
      std::fill(row + half, row + K, -1);
      if (odd) row[half] = static_cast<std::int32_t>(o);
    }
#pragma omp for schedule(static)
    for (std::int64_t o = 0; o < n; ++o) {
      const Coord4 oc = rows[o];
      std::int32_t* row = m + o * K;
      for (std::int64_t k = 0; k < half; ++k) {
        const Offset& off = offsets[static_cast<std::size_t>(k)];
        Triple64 want{};
        bool exists = true;
        for (int a = 0; a < 3 && exists; ++a) {
          want[a] = spatial(oc, a) + off[a];
          exists = geometry::fits_int32(want[a]);
        }
        const std::int32_t i =
            exists ? static_cast<std::int32_t>(geometry::host_find(
                         slots, mask,
                         Coord4{oc.b, static_cast<std::int32_t>(want[0]), static_cast<std::int32_t>(want[1]),
                                static_cast<std::int32_t>(want[2])}))
                   : -1;
        row[k] = i;
        if (i >= 0) m[std::int64_t{i} * K + (K - 1 - k)] = static_cast<std::int32_t>(o);
      }
    }
  }
}

}  // namespace

DeviceCoordTable relation_cpu_hash_build_table(const Array& coords) {
  const std::int64_t n = coords.dim(0);
  DeviceCoordTable table;
  const std::uint64_t capacity = table_capacity(n, 1);
  table.mask = capacity - 1;
  table.slots = Array::empty({static_cast<std::int64_t>(capacity), 5}, Dtype::i32);
  auto* slots = reinterpret_cast<HostCoordSlot*>(table.slots.data<std::int32_t>());
  std::fill(slots, slots + capacity, HostCoordSlot{{0, 0, 0, 0}, -1});
  // Sequential insertion in row order, so the duplicate recorded is always the first row that
  // repeats an earlier one (deterministic message); insertion stops there.
  const Coord4* rows = rows_of(coords);
  for (std::int64_t r = 0; r < n; ++r) {
    std::uint64_t h = geometry::hash_coord(rows[r]) & table.mask;
    while (slots[h].row >= 0) {
      if (slots[h].key == rows[r]) {
        table.duplicate = DuplicateRow{r, slots[h].row, rows[r]};
        return table;
      }
      h = (h + 1) & table.mask;
    }
    slots[h] = HostCoordSlot{rows[r], static_cast<std::int32_t>(r)};
  }
  return table;
}

DuplicateRow relation_cpu_hash_find_duplicate(const Array&, const DeviceCoordTable& table) {
  return table.duplicate;
}

BatchHistogram relation_cpu_hash_batch_histogram(const Array& coords, std::int64_t n_batches) {
  BatchHistogram h;
  h.counts.assign(static_cast<std::size_t>(std::max<std::int64_t>(n_batches, 0)), 0);
  const Coord4* rows = rows_of(coords);
  for (std::int64_t r = 0; r < coords.dim(0); ++r) {
    if (rows[r].b < 0 || rows[r].b >= n_batches) {
      if (h.bad_row < 0) {
        h.bad_row = r;
        h.bad_batch = rows[r].b;
      }
      continue;
    }
    ++h.counts[static_cast<std::size_t>(rows[r].b)];
  }
  return h;
}

DeviceSupportResult relation_cpu_hash_support(const DeviceSupportArgs& args) {
  DeviceSupportResult result;
  const Coord4* in = rows_of(args.coords);
  const std::int64_t n_in = args.coords.dim(0);
  const Triple64& s = args.stride;
  const Triple64& p = args.padding;
  UniqueCoordBuilder builder(n_in);
  if (args.rule == SupportRule::downsample) {
    // unique floor_div(c, s), first occurrence over input rows.
    for (std::int64_t i = 0; i < n_in; ++i) {
      const Coord4& c = in[i];
      builder.insert(Coord4{c.b, static_cast<std::int32_t>(geometry::floor_div(c.x, s[0])),
                            static_cast<std::int32_t>(geometry::floor_div(c.y, s[1])),
                            static_cast<std::int32_t>(geometry::floor_div(c.z, s[2]))});
    }
    result.coords = builder.finish();
    return result;
  }
  const std::vector<Offset> offsets = kernel_offsets(args.spec, args.centered, volume(args.spec));
  const bool expand = args.rule == SupportRule::expand;
  for (std::int64_t i = 0; i < n_in; ++i) {
    for (const Offset& off : offsets) {
      Triple64 o{};
      if (expand) {
        // every o = (c_i + p - off_k) / s that divides exactly on every axis.
        bool divisible = true;
        for (int a = 0; a < 3 && divisible; ++a) {
          const std::int64_t num = spatial(in[i], a) + p[a] - off[a];
          o[a] = geometry::floor_div(num, s[a]);
          divisible = o[a] * s[a] == num;
        }
        if (!divisible) continue;
        for (int a = 0; a < 3; ++a) {
          if (!in_range(result, o[a], i)) return result;
        }
      } else {
        // transposed / generative: c_i*s + off_k - p.
        for (int a = 0; a < 3; ++a) {
          o[a] = spatial(in[i], a) * s[a] + off[a] - p[a];
          if (!in_range(result, o[a], i)) return result;
        }
      }
      builder.insert(Coord4{in[i].b, static_cast<std::int32_t>(o[0]), static_cast<std::int32_t>(o[1]),
                            static_cast<std::int32_t>(o[2])});
      if (builder.size() > geometry::kInt32Max) {
        result.too_many_rows = true;
        return result;
      }
    }
  }
  result.coords = builder.finish();
  return result;
}

std::int64_t relation_cpu_hash_count_edges(const Array& map);

DeviceEdges relation_cpu_hash_edges(const DeviceEdgeArgs& args) {
  LATTICE_ASSERT(args.input_table != nullptr, "relation_cpu_hash_edges needs the input's index");
  const std::int64_t K = args.kernel_volume;
  const std::int64_t n_out = args.output.dim(0);
  const std::vector<Offset> offsets = kernel_offsets(args.spec, args.centered, K);
  const Triple64& s = args.stride;
  const Triple64& p = args.padding;
  const bool scatter = args.scatter;
  const auto* slots = reinterpret_cast<const HostCoordSlot*>(args.input_table->slots.data<std::int32_t>());
  const std::uint64_t mask = args.input_table->mask;
  const Coord4* out = rows_of(args.output);

  // The (n_out, K) map: input row feeding (o, k), or -1. Gather rule (forward, target,
  // submanifold): c_i = o*s + off_k - p. Scatter rule (transposed kinds): o = c_i*s + off_k - p,
  // i.e. c_i = (o - off_k + p) / s when that divides exactly on every axis.
  DeviceEdges edges;
  Array map = Array::empty({n_out, K}, Dtype::i32);
  std::int32_t* m = map.data<std::int32_t>();
  if (!scatter && mirrors_itself(args, offsets)) {
    fill_mirrored_map(args, offsets, slots, mask, m);
  } else {
#pragma omp parallel for schedule(static) num_threads(num_threads()) if (n_out * K >= kMinParallelPairs)
  for (std::int64_t o = 0; o < n_out; ++o) {
    const Coord4 oc = out[o];
    std::int32_t* row = m + o * K;
    for (std::int64_t k = 0; k < K; ++k) {
      Triple64 want{};
      bool exists = true;
      for (int a = 0; a < 3 && exists; ++a) {
        if (scatter) {
          const std::int64_t d = spatial(oc, a) - offsets[k][a] + p[a];
          want[a] = geometry::floor_div(d, s[a]);
          exists = want[a] * s[a] == d;
        } else {
          want[a] = spatial(oc, a) * s[a] + offsets[k][a] - p[a];
        }
        exists = exists && geometry::fits_int32(want[a]);
      }
      row[k] = exists ? static_cast<std::int32_t>(geometry::host_find(
                            slots, mask,
                            Coord4{oc.b, static_cast<std::int32_t>(want[0]), static_cast<std::int32_t>(want[1]),
                                   static_cast<std::int32_t>(want[2])}))
                      : -1;
    }
  }
  }
  // The map is the relation's one stored view (lattice/tensor/relation.h "Views"): the edge
  // count is the caller's hint (-1: counted on first use), as on a device. The caller's geometric
  // hints (which a device route trusts instead of reading counts back) must agree with what was
  // found: every CPU build checks them.
  edges.identity = is_identity(map, args.input.dim(0));
  edges.n_edges = edges.identity ? n_out : args.known_edges;  // the identity has one edge per row
  if (args.known_edges >= 0) {
    LATTICE_ASSERT(args.known_edges == relation_cpu_hash_count_edges(map),
                   "relation edge-count hint disagrees with the edges found");
  }
  LATTICE_ASSERT(!args.known_identity || edges.identity, "relation identity hint disagrees with the edges found");
  edges.map = std::move(map);
  return edges;
}

std::int64_t relation_cpu_hash_count_edges(const Array& map) {
  const std::int64_t n = map.dim(0);
  const std::int64_t K = map.dim(1);
  const std::int32_t* m = map.data<std::int32_t>();
  std::int64_t total = 0;
#pragma omp parallel for schedule(static) reduction(+ : total) num_threads(num_threads()) if (n * K >= kMinParallelPairs)
  for (std::int64_t o = 0; o < n; ++o) total += count_row(m + o * K, K);
  return total;
}

Array relation_cpu_hash_row_ptr(const Array& map) {
  const std::int64_t n = map.dim(0);
  const std::int64_t K = map.dim(1);
  const std::int32_t* m = map.data<std::int32_t>();
  Array out = Array::empty({n + 1}, Dtype::i64);
  std::int64_t* ptr = out.data<std::int64_t>();
  ptr[0] = 0;
#pragma omp parallel for schedule(static) num_threads(num_threads()) if (n * K >= kMinParallelPairs)
  for (std::int64_t o = 0; o < n; ++o) ptr[o + 1] = count_row(m + o * K, K);
  for (std::int64_t o = 0; o < n; ++o) ptr[o + 1] += ptr[o];
  return out;
}

// The output-major list (sorted by (o, k)) from the map and its row CSR.
DeviceEdgeList relation_cpu_hash_edge_list(const Array& map, const Array& row_ptr, std::int64_t n_edges) {
  const std::int64_t n_out = map.dim(0);
  const std::int64_t K = map.dim(1);
  const std::int32_t* m = map.data<std::int32_t>();
  const std::int64_t* ptr = row_ptr.data<std::int64_t>();
  LATTICE_ASSERT(ptr[n_out] == n_edges, "edge list: row pointer and edge count disagree");
  DeviceEdgeList r;
  r.in_idx = Array::empty({n_edges}, Dtype::i32);
  r.out_idx = Array::empty({n_edges}, Dtype::i32);
  r.k_idx = Array::empty({n_edges}, Dtype::i32);
  std::int32_t* in_idx = r.in_idx.data<std::int32_t>();
  std::int32_t* out_idx = r.out_idx.data<std::int32_t>();
  std::int32_t* k_idx = r.k_idx.data<std::int32_t>();
#pragma omp parallel for schedule(static) num_threads(num_threads()) if (n_out * K >= kMinParallelPairs)
  for (std::int64_t o = 0; o < n_out; ++o) {
    std::int64_t e = ptr[o];
    for (std::int64_t k = 0; k < K; ++k) {
      const std::int32_t i = m[o * K + k];
      if (i < 0) continue;
      in_idx[e] = i;
      out_idx[e] = static_cast<std::int32_t>(o);
      k_idx[e] = static_cast<std::int32_t>(k);
      ++e;
    }
  }
  return r;
}

// The per-offset grouping sorted by (k, o), straight from the map: per fixed chunk of output rows
// the edges of each offset are counted, the counts are laid out offset-major then chunk-major, and
// each chunk writes its rows in ascending order. The result does not depend on the chunking.
DeviceOffsetGrouping relation_cpu_hash_per_offset(const Array& map, std::int64_t n_edges) {
  const std::int64_t n_out = map.dim(0);
  const std::int64_t K = map.dim(1);
  const std::int32_t* m = map.data<std::int32_t>();
  const std::int64_t chunks =
      n_out * K < kMinParallelPairs ? 1 : std::max<std::int64_t>(1, std::min<std::int64_t>(num_threads(), n_out));
  auto rows_of_chunk = [&](std::int64_t c) { return std::pair{n_out * c / chunks, n_out * (c + 1) / chunks}; };
  // cursor[c * K + k]: edges of offset k in chunk c, then the position of the chunk's first one.
  std::vector<std::int64_t> cursor(static_cast<std::size_t>(chunks * K), 0);
#pragma omp parallel for schedule(static) num_threads(num_threads()) if (chunks > 1)
  for (std::int64_t c = 0; c < chunks; ++c) {
    auto [begin, end] = rows_of_chunk(c);
    std::int64_t* cur = cursor.data() + c * K;
    for (std::int64_t o = begin; o < end; ++o)
      for (std::int64_t k = 0; k < K; ++k) cur[k] += m[o * K + k] >= 0;
  }
  DeviceOffsetGrouping r;
  r.k_ptr = Array::empty({K + 1}, Dtype::i64);
  std::int64_t* k_ptr = r.k_ptr.data<std::int64_t>();
  std::int64_t running = 0;
  for (std::int64_t k = 0; k < K; ++k) {
    k_ptr[k] = running;
    for (std::int64_t c = 0; c < chunks; ++c) {
      const std::int64_t count = cursor[c * K + k];
      cursor[c * K + k] = running;
      running += count;
    }
  }
  k_ptr[K] = running;
  if (n_edges < 0) {  // the count from the scan, returned with the bounds (as on a device)
    n_edges = running;
    r.host_k_ptr.assign(k_ptr, k_ptr + K + 1);
  }
  LATTICE_ASSERT(running == n_edges, "per-offset grouping: edge count disagrees with the map");
  r.k_in = Array::empty({n_edges}, Dtype::i32);
  r.k_out = Array::empty({n_edges}, Dtype::i32);
  std::int32_t* k_in = r.k_in.data<std::int32_t>();
  std::int32_t* k_out = r.k_out.data<std::int32_t>();
#pragma omp parallel for schedule(static) num_threads(num_threads()) if (chunks > 1)
  for (std::int64_t c = 0; c < chunks; ++c) {
    auto [begin, end] = rows_of_chunk(c);
    std::int64_t* cur = cursor.data() + c * K;
    for (std::int64_t o = begin; o < end; ++o) {
      for (std::int64_t k = 0; k < K; ++k) {
        const std::int32_t i = m[o * K + k];
        if (i < 0) continue;
        const std::int64_t pos = cur[k]++;
        k_in[pos] = i;
        k_out[pos] = static_cast<std::int32_t>(o);
      }
    }
  }
  return r;
}

// Stored as int64 (the Array dtypes have no uint64); the words are uint64 bit patterns.
Array relation_cpu_hash_row_masks(const Array& map) {
  const std::int64_t n_out = map.dim(0);
  const std::int64_t K = map.dim(1);
  const std::int64_t words = (K + 63) / 64;
  Array masks = Array::zeros({n_out, words}, Dtype::i64);
  auto* bits = reinterpret_cast<std::uint64_t*>(masks.data<std::int64_t>());
  const std::int32_t* m = map.data<std::int32_t>();
#pragma omp parallel for schedule(static) num_threads(num_threads()) if (n_out * K >= kMinParallelPairs)
  for (std::int64_t o = 0; o < n_out; ++o) {
    for (std::int64_t k = 0; k < K; ++k) {
      if (m[o * K + k] >= 0) bits[o * words + k / 64] |= std::uint64_t{1} << (k % 64);
    }
  }
  return masks;
}

DeviceInputGrouping relation_cpu_hash_input_grouping(const DeviceInputGroupingArgs& args) {
  const std::int64_t n_in = args.n_in;
  const std::int64_t n_edges = args.n_edges;
  const std::int64_t K = args.kernel_volume;
  DeviceInputGrouping g;
  g.in_ptr = Array::zeros({n_in + 1}, Dtype::i64);
  g.kt_in = Array::empty({n_edges}, Dtype::i32);
  g.kt_out = Array::empty({n_edges}, Dtype::i32);
  std::int64_t* ptr = g.in_ptr.data<std::int64_t>();
  const std::int32_t* in = args.k_in.data<std::int32_t>();  // every edge's input row, once
  for (std::int64_t e = 0; e < n_edges; ++e) ++ptr[in[e] + 1];
  for (std::int64_t i = 0; i < n_in; ++i) ptr[i + 1] += ptr[i];
  const std::int64_t* kp = args.k_ptr.data<std::int64_t>();
  const std::int32_t* src_in = args.k_in.data<std::int32_t>();
  const std::int32_t* src_out = args.k_out.data<std::int32_t>();
  std::int32_t* dst_in = g.kt_in.data<std::int32_t>();
  std::int32_t* dst_out = g.kt_out.data<std::int32_t>();
  if (n_edges == 0) return g;
  sort_input_grouping(kp, src_in, src_out, K, n_edges, dst_in, dst_out);
  return g;
}

// The input-side map: scatter the map's entries (every (input row, offset) holds at most one edge,
// so the scatter has no conflicts). It is the transposed relation's map, bitwise equal to hashing
// the transposed rule directly.
Array relation_cpu_hash_input_map(const Array& fwd, std::int64_t n_in) {
  const std::int64_t n_out = fwd.dim(0);
  const std::int64_t K = fwd.dim(1);
  Array map = Array::empty({n_in, K}, Dtype::i32);
  std::int32_t* m = map.data<std::int32_t>();
  std::fill(m, m + n_in * K, -1);
  const std::int32_t* f = fwd.data<std::int32_t>();
#pragma omp parallel for schedule(static) num_threads(num_threads()) if (n_out * K >= kMinParallelPairs)
  for (std::int64_t o = 0; o < n_out; ++o) {
    for (std::int64_t k = 0; k < K; ++k) {
      const std::int32_t i = f[o * K + k];
      if (i >= 0) m[std::int64_t{i} * K + k] = static_cast<std::int32_t>(o);
    }
  }
  return map;
}

// The map with its offsets reversed (a submanifold relation's input-side map; see kernels.h).
Array relation_cpu_hash_mirror_map(const Array& map) {
  const std::int64_t n = map.dim(0);
  const std::int64_t K = map.dim(1);
  Array out = Array::empty({n, K}, Dtype::i32);
  const std::int32_t* f = map.data<std::int32_t>();
  std::int32_t* m = out.data<std::int32_t>();
#pragma omp parallel for schedule(static) num_threads(num_threads()) if (n * K >= kMinParallelPairs)
  for (std::int64_t r = 0; r < n; ++r) {
    for (std::int64_t k = 0; k < K; ++k) m[r * K + k] = f[r * K + (K - 1 - k)];
  }
  return out;
}

// Rows stably sorted by their offset mask (an unsigned integer, bit k for offset k): the order
// implicit-GEMM tiles take rows in, so that a tile's rows share offsets. Stable: rows of one mask
// keep ascending index order, so the order is a function of the map alone.
Array relation_cpu_hash_row_order(const Array& map) {
  const std::int64_t n = map.dim(0);
  if (map.dim(1) > 64) return Array();
  const Array masks = relation_cpu_hash_row_masks(map);  // (n, 1) words: the keys
  const auto* key = reinterpret_cast<const std::uint64_t*>(masks.data<std::int64_t>());
  Array order = Array::empty({n}, Dtype::i32);
  std::int32_t* ord = order.data<std::int32_t>();
  for (std::int64_t o = 0; o < n; ++o) ord[o] = static_cast<std::int32_t>(o);
  std::stable_sort(ord, ord + n, [&](std::int32_t a, std::int32_t b) { return key[a] < key[b]; });
  return order;
}

}  // namespace lattice::backend::cpu

LATTICE_ROUTE_KERNELS(RelationKernels, relation_cpu_hash, {
    .build_table = cpu::relation_cpu_hash_build_table,
    .find_duplicate = cpu::relation_cpu_hash_find_duplicate,
    .batch_histogram = cpu::relation_cpu_hash_batch_histogram,
    .support = cpu::relation_cpu_hash_support,
    .edges = cpu::relation_cpu_hash_edges,
    .count_edges = cpu::relation_cpu_hash_count_edges,
    .row_ptr = cpu::relation_cpu_hash_row_ptr,
    .edge_list = cpu::relation_cpu_hash_edge_list,
    .per_offset = cpu::relation_cpu_hash_per_offset,
    .row_masks = cpu::relation_cpu_hash_row_masks,
    .input_grouping = cpu::relation_cpu_hash_input_grouping,
    .input_map = cpu::relation_cpu_hash_input_map,
    .mirror_map = cpu::relation_cpu_hash_mirror_map,
    .row_order = cpu::relation_cpu_hash_row_order});
