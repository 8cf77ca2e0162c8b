// Specification tests for coordinate sets and relations (SEMANTICS.md "Sparse tensor",
// "Kernel geometry", "Relations"). Expected edges are written out by hand for small cases and
// checked against a brute-force edge rule on random clouds.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "backend/kernel_table.h"
#include "lattice/core/array.h"
#include "lattice/core/error.h"
#include "lattice/core/threads.h"
#include "lattice/tensor/coordinate_set.h"
#include "lattice/route/route.h"
#include "lattice/tensor/relation.h"
#include "ops/common.h"

namespace lattice {
namespace {

using Row = std::array<std::int32_t, 4>;
using Edge = std::tuple<std::int32_t, std::int32_t, std::int32_t>;  // (in, out, k)

std::shared_ptr<CoordinateSet> make_set(
    const std::vector<Row>& rows, Int3 stride = {1, 1, 1},
    std::optional<std::vector<std::int64_t>> batch_counts = {}) {
  std::vector<std::int32_t> flat;
  for (const Row& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  const auto n = static_cast<std::int64_t>(rows.size());
  return CoordinateSet::create(Array::from_vector<std::int32_t>(flat, {n, 4}), stride,
                               std::move(batch_counts));
}

std::vector<Row> rows_of(const CoordinateSet& set) {
  const std::int32_t* p = set.coords().data<std::int32_t>();
  std::vector<Row> rows(static_cast<std::size_t>(set.size()));
  for (std::size_t r = 0; r < rows.size(); ++r)
    rows[r] = {p[4 * r], p[4 * r + 1], p[4 * r + 2], p[4 * r + 3]};
  return rows;
}

template <class T>
std::vector<T> values(const Array& a) {
  const T* p = a.data<T>();
  return std::vector<T>(p, p + a.numel());
}

std::vector<Edge> edges_of(const Relation& r) {
  const auto in = values<std::int32_t>(r.in_idx());
  const auto out = values<std::int32_t>(r.out_idx());
  const auto k = values<std::int32_t>(r.k_idx());
  std::vector<Edge> edges;
  for (std::size_t e = 0; e < in.size(); ++e) edges.emplace_back(in[e], out[e], k[e]);
  return edges;
}

KernelSpec spec_of(Int3 size, Int3 stride = {1, 1, 1}, Int3 padding = {0, 0, 0},
                   Int3 dilation = {1, 1, 1}, bool expand = false) {
  KernelSpec spec;
  spec.size = size;
  spec.stride = stride;
  spec.padding = padding;
  spec.dilation = dilation;
  spec.expand = expand;
  return spec;
}

Int3 cube(std::int32_t v) { return {v, v, v}; }

// Kernel row of per-axis indices (x-major, z fastest).
std::int32_t krow(Int3 size, std::int32_t ix, std::int32_t iy, std::int32_t iz) {
  return (ix * size[1] + iy) * size[2] + iz;
}

CoordinateSet::RelationResult relate(const std::shared_ptr<CoordinateSet>& in, RelationKind kind,
                                     const KernelSpec& spec,
                                     const std::shared_ptr<CoordinateSet>& target = nullptr) {
  return in->relation(kind, spec, target, "test");
}

// Every structural invariant of a relation: CSR pointers, (o, k) order, per-offset grouping,
// gemm map and row masks all describe the same edge set.
void expect_consistent(const Relation& r) {
  const auto edges = edges_of(r);
  ASSERT_EQ(static_cast<std::int64_t>(edges.size()), r.n_edges());
  const auto out_ptr = values<std::int64_t>(r.out_ptr());
  ASSERT_EQ(static_cast<std::int64_t>(out_ptr.size()), r.n_out + 1);
  EXPECT_EQ(out_ptr.front(), 0);
  EXPECT_EQ(out_ptr.back(), r.n_edges());
  for (std::int64_t o = 0; o < r.n_out; ++o) {
    for (std::int64_t e = out_ptr[o]; e < out_ptr[o + 1]; ++e) EXPECT_EQ(std::get<1>(edges[e]), o);
  }
  for (std::size_t e = 1; e < edges.size(); ++e) {
    EXPECT_LT(std::make_pair(std::get<1>(edges[e - 1]), std::get<2>(edges[e - 1])),
              std::make_pair(std::get<1>(edges[e]), std::get<2>(edges[e])))
        << "output-major list not strictly sorted by (o, k) at edge " << e;
  }

  const auto k_ptr = values<std::int64_t>(r.k_ptr());
  const auto k_in = values<std::int32_t>(r.k_in());
  const auto k_out = values<std::int32_t>(r.k_out());
  ASSERT_EQ(static_cast<std::int64_t>(k_ptr.size()), r.kernel_volume + 1);
  EXPECT_EQ(k_ptr.front(), 0);
  EXPECT_EQ(k_ptr.back(), r.n_edges());
  std::vector<Edge> grouped;
  for (std::int64_t k = 0; k < r.kernel_volume; ++k) {
    for (std::int64_t e = k_ptr[k]; e < k_ptr[k + 1]; ++e) {
      if (e > k_ptr[k]) {
        EXPECT_LT(k_out[e - 1], k_out[e]) << "offset " << k << " not sorted by o";
      }
      grouped.emplace_back(k_in[e], k_out[e], static_cast<std::int32_t>(k));
    }
  }
  EXPECT_EQ(std::multiset<Edge>(grouped.begin(), grouped.end()),
            std::multiset<Edge>(edges.begin(), edges.end()));

  const Array& map = r.gemm_map();
  ASSERT_EQ(map.shape(), (Shape{r.n_out, r.kernel_volume}));
  const auto m = values<std::int32_t>(map);
  std::int64_t present = 0;
  for (std::int32_t v : m) present += v >= 0;
  EXPECT_EQ(present, r.n_edges());
  for (const auto& [i, o, k] : edges) EXPECT_EQ(m[o * r.kernel_volume + k], i);

  const Array& masks = r.row_masks();
  const std::int64_t words = (r.kernel_volume + 63) / 64;
  ASSERT_EQ(masks.shape(), (Shape{r.n_out, words}));
  const auto* bits = reinterpret_cast<const std::uint64_t*>(masks.raw_data());
  for (std::int64_t o = 0; o < r.n_out; ++o) {
    for (std::int64_t k = 0; k < r.kernel_volume; ++k) {
      const bool bit = (bits[o * words + k / 64] >> (k % 64)) & 1u;
      EXPECT_EQ(bit, m[o * r.kernel_volume + k] >= 0) << "o " << o << " k " << k;
    }
  }

  // The input-side grouping (what input gradients walk): in_ptr counts the edges of every input
  // row, and within each offset the (input, output) pairs are sorted strictly by input row and
  // are exactly that offset's edges.
  const Relation::InputGrouping& g = r.input_grouping();
  const auto in_ptr = values<std::int64_t>(g.in_ptr);
  const auto kt_in = values<std::int32_t>(g.kt_in);
  const auto kt_out = values<std::int32_t>(g.kt_out);
  ASSERT_EQ(static_cast<std::int64_t>(in_ptr.size()), r.n_in + 1);
  ASSERT_EQ(static_cast<std::int64_t>(kt_in.size()), r.n_edges());
  std::vector<std::int64_t> per_input(static_cast<std::size_t>(r.n_in), 0);
  for (const auto& [i, o, k] : edges) ++per_input[static_cast<std::size_t>(i)];
  for (std::int64_t i = 0; i < r.n_in; ++i) EXPECT_EQ(in_ptr[i + 1] - in_ptr[i], per_input[i]) << "input " << i;
  std::vector<Edge> by_input;
  for (std::int64_t k = 0; k < r.kernel_volume; ++k) {
    for (std::int64_t e = k_ptr[k]; e < k_ptr[k + 1]; ++e) {
      if (e > k_ptr[k]) {
        EXPECT_LT(kt_in[e - 1], kt_in[e]) << "offset " << k << " of the input grouping not sorted by input";
      }
      by_input.emplace_back(kt_in[e], kt_out[e], static_cast<std::int32_t>(k));
    }
  }
  EXPECT_EQ(std::multiset<Edge>(by_input.begin(), by_input.end()),
            std::multiset<Edge>(edges.begin(), edges.end()));
}

// Brute force over every (input, output) pair: the edge rule of SEMANTICS.md computed in int64.
std::vector<Edge> brute_force_edges(const std::vector<Row>& in, const std::vector<Row>& out,
                                    RelationKind kind, const KernelSpec& spec) {
  const bool centered = uses_centered_offsets(kind);
  const bool transposed = is_transposed_kind(kind);
  const bool subm = kind == RelationKind::submanifold;
  const std::int64_t K = spec.volume();
  std::vector<Edge> edges;
  for (std::size_t o = 0; o < out.size(); ++o) {
    for (std::int64_t k = 0; k < K; ++k) {
      const std::int64_t idx[3] = {k / (std::int64_t{spec.size[1]} * spec.size[2]),
                                   (k / spec.size[2]) % spec.size[1], k % spec.size[2]};
      for (std::size_t i = 0; i < in.size(); ++i) {
        if (in[i][0] != out[o][0]) continue;
        bool hit = true;
        for (int a = 0; a < 3; ++a) {
          const std::int64_t base =
              centered && spec.size[a] % 2 == 1 ? idx[a] - spec.size[a] / 2 : idx[a];
          const std::int64_t off = base * spec.dilation[a];
          const std::int64_t s = subm ? 1 : spec.stride[a];
          const std::int64_t p = subm || kind == RelationKind::generative ? 0 : spec.padding[a];
          const std::int64_t ci = in[i][a + 1];
          const std::int64_t co = out[o][a + 1];
          hit = hit && (transposed ? co == ci * s + off - p : ci == co * s + off - p);
        }
        if (hit)
          edges.emplace_back(static_cast<std::int32_t>(i), static_cast<std::int32_t>(o),
                             static_cast<std::int32_t>(k));
      }
    }
  }
  return edges;
}

std::vector<Row> random_cloud(std::mt19937& rng, int n, int batches, int extent) {
  std::uniform_int_distribution<int> b(0, batches - 1), v(-extent, extent);
  std::set<Row> seen;
  std::vector<Row> rows;
  while (static_cast<int>(rows.size()) < n) {
    Row r{b(rng), v(rng), v(rng), v(rng)};
    if (seen.insert(r).second) rows.push_back(r);
  }
  return rows;
}

template <class E>
std::string error_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "<no exception>";
}

// ---- small exact cases -------------------------------------------------------------------

TEST(Relation, Subm3LineHasSevenEdges) {
  auto x = make_set({{0, 0, 0, 0}, {0, 1, 0, 0}, {0, 2, 0, 0}});
  auto [rel, out] = relate(x, RelationKind::submanifold, spec_of(cube(3)));
  EXPECT_EQ(out, x);  // same set, same key
  EXPECT_EQ(rel->n_out, 3);
  EXPECT_EQ(rel->kernel_volume, 27);
  // Offsets dx = -1, 0, +1 (dy = dz = 0) are kernel rows 4, 13, 22.
  const std::vector<Edge> expected{{0, 0, 13}, {1, 0, 22}, {0, 1, 4}, {1, 1, 13},
                                   {2, 1, 22}, {1, 2, 4},  {2, 2, 13}};
  EXPECT_EQ(edges_of(*rel), expected);
  EXPECT_EQ(values<std::int64_t>(rel->out_ptr()), (std::vector<std::int64_t>{0, 2, 5, 7}));
  EXPECT_FALSE(rel->identity);
  expect_consistent(*rel);
}

TEST(Relation, ForwardK2S2CubeHasOneOutputWithEightEdges) {
  // The 2x2x2 cube in a scrambled row order; indexed offsets make k = 4x + 2y + z.
  const std::vector<Row> in{{0, 1, 1, 0}, {0, 0, 0, 0}, {0, 1, 0, 1}, {0, 0, 1, 1},
                            {0, 1, 1, 1}, {0, 0, 0, 1}, {0, 1, 0, 0}, {0, 0, 1, 0}};
  auto x = make_set(in);
  auto [rel, out] = relate(x, RelationKind::forward, spec_of(cube(2), cube(2)));
  ASSERT_EQ(rows_of(*out), (std::vector<Row>{{0, 0, 0, 0}}));
  EXPECT_EQ(out->stride(), cube(2));
  EXPECT_NE(out->key(), x->key());
  std::vector<Edge> expected;
  for (std::int32_t k = 0; k < 8; ++k) {
    for (std::int32_t i = 0; i < 8; ++i) {
      if (in[i][1] * 4 + in[i][2] * 2 + in[i][3] == k) expected.emplace_back(i, 0, k);
    }
  }
  EXPECT_EQ(edges_of(*rel), expected);
  expect_consistent(*rel);
}

TEST(Relation, ForwardK3S2NegativeCoordsUseFloorDivision) {
  auto x = make_set({{0, -1, -2, -3}, {0, -2, -1, -4}, {0, 1, 0, -1}});
  auto [rel, out] = relate(x, RelationKind::forward, spec_of(cube(3), cube(2)));
  // floor(-1/2) = -1, floor(-3/2) = -2: rows 0 and 1 share an output.
  EXPECT_EQ(rows_of(*out), (std::vector<Row>{{0, -1, -1, -2}, {0, 0, 0, -1}}));
  // c_i = 2o + off: row 0 is off (1, 0, 1) -> k 23, row 1 is off (0, 1, 0) -> k 16 of output 0;
  // row 2 is off (1, 0, 1) of output 1.
  EXPECT_EQ(edges_of(*rel), (std::vector<Edge>{{1, 0, 16}, {0, 0, 23}, {2, 1, 23}}));
  expect_consistent(*rel);
}

TEST(Relation, TransposedK2S2OnePointHasEightChildrenInKernelOrder) {
  auto x = make_set({{3, 1, 2, 3}}, cube(2));
  auto [rel, out] = relate(x, RelationKind::transposed, spec_of(cube(2), cube(2)));
  std::vector<Row> children;
  std::vector<Edge> expected;
  for (std::int32_t dx = 0; dx < 2; ++dx) {
    for (std::int32_t dy = 0; dy < 2; ++dy) {
      for (std::int32_t dz = 0; dz < 2; ++dz) {
        const auto k = static_cast<std::int32_t>(children.size());
        children.push_back({3, 2 + dx, 4 + dy, 6 + dz});
        expected.emplace_back(0, k, k);
      }
    }
  }
  EXPECT_EQ(rows_of(*out), children);
  EXPECT_EQ(out->stride(), cube(1));
  EXPECT_EQ(edges_of(*rel), expected);
  expect_consistent(*rel);
}

TEST(Relation, TransposedStrideMustDivideInputStride) {
  auto x = make_set({{0, 0, 0, 0}}, cube(2));
  EXPECT_EQ(error_message<ValueError>(
                [&] { relate(x, RelationKind::transposed, spec_of(cube(3), cube(3))); }),
            "[test] stride: expected a divisor of the input stride (2, 2, 2), got (3, 3, 3)");
}

TEST(Relation, GenerativeK3S2NeighboursAreDeduplicated) {
  auto x = make_set({{0, 0, 0, 0}, {0, 1, 0, 0}}, cube(2));
  auto [rel, out] = relate(x, RelationKind::generative, spec_of(cube(3), cube(2)));
  // Children of row 0 cover x in 0..2, of row 1 x in 2..4: the x = 2 plane is shared.
  ASSERT_EQ(rel->n_out, 27 + 18);
  EXPECT_EQ(rel->n_edges(), 2 * 27);
  const auto rows = rows_of(*out);
  for (std::int32_t k = 0; k < 27; ++k) {
    EXPECT_EQ(rows[k], (Row{0, k / 9, (k / 3) % 3, k % 3})) << "child " << k << " of row 0";
  }
  for (std::int32_t j = 0; j < 18; ++j) {
    const std::int32_t k = 9 + j;  // row 1's children with x offset 1, 2
    EXPECT_EQ(rows[27 + j], (Row{0, 2 + k / 9, (k / 3) % 3, k % 3}));
  }
  // Output 18 = (0, 2, 0, 0): offset (0,0,0) of row 1 (k 0) and offset (2,0,0) of row 0 (k 18).
  const auto out_ptr = values<std::int64_t>(rel->out_ptr());
  const auto edges = edges_of(*rel);
  ASSERT_EQ(out_ptr[19] - out_ptr[18], 2);
  EXPECT_EQ(edges[out_ptr[18]], (Edge{1, 18, 0}));
  EXPECT_EQ(edges[out_ptr[18] + 1], (Edge{0, 18, 18}));
  expect_consistent(*rel);
}

TEST(Relation, ForwardExpandK3S1OnePointGrowsTo27Outputs) {
  auto x = make_set({{0, 5, 5, 5}});
  auto [rel, out] = relate(x, RelationKind::forward, spec_of(cube(3), cube(1), {}, cube(1), true));
  ASSERT_EQ(rel->n_out, 27);
  const auto rows = rows_of(*out);
  std::vector<Edge> expected;
  for (std::int32_t k = 0; k < 27; ++k) {
    // o = c - off_k, in kernel order; the only edge of o is the same offset.
    EXPECT_EQ(rows[k], (Row{0, 5 - (k / 9 - 1), 5 - ((k / 3) % 3 - 1), 5 - (k % 3 - 1)}));
    expected.emplace_back(0, k, k);
  }
  EXPECT_EQ(edges_of(*rel), expected);
  EXPECT_EQ(out->stride(), cube(1));
  EXPECT_NE(out, x);
  expect_consistent(*rel);
}

TEST(Relation, ForwardStrideOneWithoutExpandKeepsTheInput) {
  auto x = make_set({{0, 0, 0, 0}, {0, 1, 0, 0}});
  auto [rel, out] = relate(x, RelationKind::forward, spec_of(cube(2)));
  EXPECT_EQ(out, x);
  // Indexed offsets: output 0 reads itself (k 0) and x + 1 (k 4).
  EXPECT_EQ(edges_of(*rel), (std::vector<Edge>{{0, 0, 0}, {1, 0, 4}, {1, 1, 0}}));
}

TEST(Relation, TargetRelationUsesTheTargetRowsInTheirOrder) {
  auto x = make_set({{0, 0, 0, 0}, {0, 3, 1, 0}, {0, 8, 8, 8}});
  auto t = make_set({{0, 1, 0, 0}, {0, 0, 0, 0}, {0, 50, 50, 50}}, cube(2));
  auto [rel, out] = relate(x, RelationKind::target, spec_of(cube(2), cube(2)), t);
  EXPECT_EQ(out, t);
  EXPECT_EQ(rel->n_out, 3);
  // c_i = 2o + off (indexed): (3,1,0) = 2*(1,0,0) + (1,1,0) -> k 6; (0,0,0) -> output 1, k 0.
  EXPECT_EQ(edges_of(*rel), (std::vector<Edge>{{1, 0, 6}, {0, 1, 0}}));
  EXPECT_EQ(values<std::int64_t>(rel->out_ptr()), (std::vector<std::int64_t>{0, 1, 2, 2}));
  expect_consistent(*rel);
}

TEST(Relation, TransposedTargetUsesTheTransposedRule) {
  auto x = make_set({{0, 0, 0, 0}, {0, 1, 0, 0}}, cube(2));
  auto t = make_set({{0, 3, 1, 0}, {0, 9, 9, 9}, {0, 0, 0, 0}});
  auto [rel, out] = relate(x, RelationKind::transposed_target, spec_of(cube(2), cube(2)), t);
  EXPECT_EQ(out, t);
  // o = 2c + off: (3,1,0) = 2*(1,0,0) + (1,1,0) -> k 6; (0,0,0) = row 0 with k 0.
  EXPECT_EQ(edges_of(*rel), (std::vector<Edge>{{1, 0, 6}, {0, 2, 0}}));
  expect_consistent(*rel);
}

TEST(Relation, TargetKindsRequireATarget) {
  auto x = make_set({{0, 0, 0, 0}});
  EXPECT_EQ(error_message<ValueError>([&] { relate(x, RelationKind::target, spec_of(cube(2))); }),
            "[test] target: expected a target coordinate set for a target relation, got none");
}

TEST(Relation, NonCubicKernel315) {
  const Int3 size{3, 1, 5};
  auto x = make_set({{0, 0, 0, 0}, {0, 0, 0, 2}, {0, 1, 0, -1}, {0, 0, 1, 0}, {0, 0, 0, 3}});
  auto [rel, out] = relate(x, RelationKind::submanifold, spec_of(size));
  EXPECT_EQ(rel->kernel_volume, 15);
  // Output 0 sees itself, (0,0,2) at dz = +2 and (1,0,-1) at (dx, dz) = (+1, -1); the y
  // neighbour is outside a kernel of height 1 and (0,0,3) is beyond dz = +2.
  const auto out_ptr = values<std::int64_t>(rel->out_ptr());
  const auto edges = edges_of(*rel);
  const std::vector<Edge> first(edges.begin() + out_ptr[0], edges.begin() + out_ptr[1]);
  EXPECT_EQ(first, (std::vector<Edge>{{0, 0, krow(size, 1, 0, 2)},
                                      {1, 0, krow(size, 1, 0, 4)},
                                      {2, 0, krow(size, 2, 0, 1)}}));
  EXPECT_EQ(edges,
            brute_force_edges(rows_of(*x), rows_of(*x), RelationKind::submanifold, spec_of(size)));
  expect_consistent(*rel);
}

TEST(Relation, Dilation2SkipsDirectNeighbours) {
  auto x = make_set({{0, 0, 0, 0}, {0, 1, 0, 0}, {0, 2, 0, 0}});
  auto [rel, out] =
      relate(x, RelationKind::submanifold, spec_of(cube(3), cube(1), cube(0), cube(2)));
  EXPECT_EQ(edges_of(*rel),
            (std::vector<Edge>{{0, 0, 13}, {2, 0, 22}, {1, 1, 13}, {0, 2, 4}, {2, 2, 13}}));
  expect_consistent(*rel);
}

TEST(Relation, PaddingShiftsTheForwardWindow) {
  // k3 s2 p1 along x, centered offsets: c_i = 2o + off - 1, so output o reads x in
  // 2o-2 .. 2o. The support is still floor_div(c, 2); x = 1 lies in no window of it.
  auto x = make_set({{0, -2, 0, 0}, {0, 0, 0, 0}, {0, 1, 0, 0}});
  const KernelSpec spec = spec_of({3, 1, 1}, {2, 1, 1}, {1, 0, 0});
  auto [rel, out] = relate(x, RelationKind::forward, spec);
  EXPECT_EQ(rows_of(*out), (std::vector<Row>{{0, -1, 0, 0}, {0, 0, 0, 0}}));
  EXPECT_EQ(edges_of(*rel), (std::vector<Edge>{{0, 0, 2}, {0, 1, 0}, {1, 1, 2}}));
  expect_consistent(*rel);
}

TEST(Relation, BatchesNeverMix) {
  auto x = make_set({{0, 0, 0, 0}, {1, 0, 0, 0}, {1, 1, 0, 0}, {0, 4, 4, 4}}, cube(1),
                    std::vector<std::int64_t>{2, 2});
  auto [subm, same] = relate(x, RelationKind::submanifold, spec_of(cube(3)));
  for (const auto& [i, o, k] : edges_of(*subm)) {
    EXPECT_EQ(rows_of(*x)[i][0], rows_of(*x)[o][0]) << "edge " << i << " -> " << o;
  }
  EXPECT_EQ(subm->n_edges(), 4 + 2);  // four self edges, rows 1 and 2 see each other

  auto [down, coarse] = relate(x, RelationKind::forward, spec_of(cube(2), cube(2)));
  EXPECT_EQ(rows_of(*coarse), (std::vector<Row>{{0, 0, 0, 0}, {1, 0, 0, 0}, {0, 2, 2, 2}}));
  EXPECT_EQ(coarse->batch_counts(), (std::vector<std::int64_t>{2, 1}));
  EXPECT_EQ(edges_of(*down), (std::vector<Edge>{{0, 0, 0}, {1, 1, 0}, {2, 1, 4}, {3, 2, 0}}));

  auto [up, fine] = relate(coarse, RelationKind::generative, spec_of(cube(2), cube(2)));
  EXPECT_EQ(fine->batch_counts(), (std::vector<std::int64_t>{16, 8}));
  for (const auto& [i, o, k] : edges_of(*up)) {
    EXPECT_EQ(rows_of(*coarse)[i][0], rows_of(*fine)[o][0]);
  }
}

TEST(Relation, MatchesBruteForceOnRandomClouds) {
  std::mt19937 rng(1234);
  struct Case {
    RelationKind kind;
    KernelSpec spec;
    Int3 in_stride;
  };
  const std::vector<Case> cases{
      {RelationKind::submanifold, spec_of(cube(3)), cube(1)},
      {RelationKind::submanifold, spec_of({5, 3, 1}, cube(1), cube(0), {1, 2, 3}), cube(1)},
      {RelationKind::forward, spec_of(cube(3), cube(2)), cube(1)},
      {RelationKind::forward, spec_of(cube(2), cube(2)), cube(1)},
      {RelationKind::forward, spec_of({3, 2, 1}, {2, 3, 1}, {1, 0, 0}, {1, 1, 2}), cube(1)},
      {RelationKind::forward, spec_of(cube(3), cube(2), cube(1), cube(1), true), cube(1)},
      {RelationKind::forward, spec_of({2, 3, 3}, {2, 1, 3}, {0, 1, 2}, cube(1), true), cube(1)},
      {RelationKind::transposed, spec_of(cube(2), cube(2)), cube(2)},
      {RelationKind::transposed, spec_of(cube(3), cube(2), cube(1), cube(1)), cube(2)},
      {RelationKind::generative, spec_of(cube(3), cube(2)), cube(2)},
      {RelationKind::generative, spec_of({2, 1, 3}, {2, 1, 1}, {}, {1, 1, 2}), {2, 1, 1}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(to_string(c.kind)) + " " + to_string(c.spec));
    const auto in_rows = random_cloud(rng, 60, 2, 4);
    auto x = make_set(in_rows, c.in_stride);
    auto [rel, out] = relate(x, c.kind, c.spec);
    const auto out_rows = rows_of(*out);
    EXPECT_EQ(edges_of(*rel), brute_force_edges(in_rows, out_rows, c.kind, c.spec));
    EXPECT_EQ(std::set<Row>(out_rows.begin(), out_rows.end()).size(), out_rows.size());
    expect_consistent(*rel);
    if (c.kind == RelationKind::forward && c.spec.expand) {
      // Every expanded output has at least one input in its window.
      const auto out_ptr = values<std::int64_t>(rel->out_ptr());
      for (std::int64_t o = 0; o < rel->n_out; ++o) EXPECT_GT(out_ptr[o + 1], out_ptr[o]);
    }
  }
  // Onto random targets.
  const auto in_rows = random_cloud(rng, 60, 2, 4);
  const auto coarse_rows = random_cloud(rng, 40, 2, 2);
  const auto fine_rows = random_cloud(rng, 80, 2, 8);
  auto x = make_set(in_rows, cube(2));
  auto coarse = make_set(coarse_rows, cube(4));
  auto fine = make_set(fine_rows, cube(1));
  const KernelSpec spec = spec_of(cube(3), cube(2), cube(1));
  auto [to_coarse, o1] = relate(x, RelationKind::target, spec, coarse);
  EXPECT_EQ(edges_of(*to_coarse),
            brute_force_edges(in_rows, coarse_rows, RelationKind::target, spec));
  expect_consistent(*to_coarse);
  auto [to_fine, o2] = relate(x, RelationKind::transposed_target, spec, fine);
  EXPECT_EQ(edges_of(*to_fine),
            brute_force_edges(in_rows, fine_rows, RelationKind::transposed_target, spec));
  expect_consistent(*to_fine);
}

TEST(Relation, OutputMajorAndPerOffsetGroupingAgreeOnALargeCloud) {
  std::mt19937 rng(7);
  auto x = make_set(random_cloud(rng, 5000, 3, 12));
  auto [rel, out] = relate(x, RelationKind::forward, spec_of(cube(3), cube(2)));
  EXPECT_GE(rel->n_edges(), 5000);  // every input has at least its floor_div parent
  expect_consistent(*rel);
}

// Large enough (> 2^15 edges) for the parallel passes of relation building and of the
// input-side grouping (counting sort over fixed chunks of input rows): the arrays must be the
// same for one thread and for three, and consistent (sorted, complete) for both.
TEST(Relation, LargeSubmanifoldRelationIsThreadCountIndependent) {
  const int threads = num_threads();
  auto build = [](int t) {
    set_num_threads(t);
    std::mt19937 rng(21);
    auto x = make_set(random_cloud(rng, 20000, 2, 20));
    auto [rel, out] = relate(x, RelationKind::submanifold, spec_of(cube(3)));
    rel->input_grouping();
    return rel;
  };
  const auto one = build(1);
  const auto three = build(3);
  set_num_threads(threads);
  EXPECT_GE(one->n_edges(), std::int64_t{1} << 15);
  expect_consistent(*one);
  expect_consistent(*three);
  EXPECT_EQ(edges_of(*one), edges_of(*three));
  for (const auto& [a, b] : {std::pair{&one->input_grouping().kt_in, &three->input_grouping().kt_in},
                             std::pair{&one->input_grouping().kt_out, &three->input_grouping().kt_out},
                             std::pair{&one->k_in(), &three->k_in()}, std::pair{&one->k_out(), &three->k_out()}}) {
    EXPECT_EQ(values<std::int32_t>(*a), values<std::int32_t>(*b));
  }
}

// ---- lazy views (lattice/tensor/relation.h "Views") ------------------------------------------

// A submanifold 3^3 build stores its (n_out, K) map and nothing else: no edge list, no grouping,
// no count (its count is not fixed by the geometry). What a forward implicit-GEMM pass reads (the
// map and its tile order) adds only the order; the memory a relation holds for that use is
// 4 * K bytes per row plus 4 per row. Each further view appears only when asked for.
TEST(RelationViews, SubmanifoldBuildStoresTheMapAloneAndBuildsViewsOnRequest) {
  std::mt19937 rng(5);
  auto x = make_set(random_cloud(rng, 4000, 2, 14));
  auto [rel, out] = relate(x, RelationKind::submanifold, spec_of(cube(3)));
  const std::int64_t n = rel->n_out;
  EXPECT_EQ(rel->built_views(), unsigned{kViewGemmMap});
  EXPECT_EQ(rel->known_edges(), -1);
  EXPECT_EQ(rel->view_bytes(), n * 27 * 4);

  rel->gemm_map();
  ASSERT_TRUE(rel->gemm_order().defined());
  EXPECT_EQ(rel->built_views(), unsigned{kViewGemmMap | kViewGemmOrder});
  EXPECT_EQ(rel->view_bytes(), n * 27 * 4 + n * 4);
  EXPECT_EQ(rel->known_edges(), -1);  // still uncounted: the forward never needs the count

  // The per-offset grouping finds the count itself and keeps the host bounds with it.
  const auto k_ptr = values<std::int64_t>(rel->k_ptr());
  EXPECT_EQ(rel->built_views() & kViewEdgeList, 0u);
  EXPECT_NE(rel->built_views() & kViewEdgeCount, 0u);
  EXPECT_EQ(rel->known_edges(), k_ptr.back());
  EXPECT_EQ(rel->host_k_ptr(), k_ptr);
  const std::int64_t grouped = n * 27 * 4 + n * 4 + 28 * 8 + 2 * 4 * rel->n_edges();
  EXPECT_EQ(rel->view_bytes(), grouped);

  rel->in_idx();  // the output-major list, with its row pointer
  EXPECT_NE(rel->built_views() & kViewEdgeList, 0u);
  EXPECT_NE(rel->built_views() & kViewOutPtr, 0u);
  EXPECT_EQ(rel->view_bytes(), grouped + 3 * 4 * rel->n_edges() + (n + 1) * 8);
  expect_consistent(*rel);
}

// The kernels' view for the implicit-GEMM forward (what the CUDA route gets; built here from a
// CPU relation, the same code on every device): the map and its tile order, nothing else; no
// count (0 in the view), no edge list, no grouping, and the relation builds nothing more. The
// input- and weight-gradient views add what those passes read.
TEST(RelationViews, ImplicitGemmViewsHoldWhatEachPassReads) {
  std::mt19937 rng(17);
  auto x = make_set(random_cloud(rng, 2000, 2, 12));
  auto [rel, out] = relate(x, RelationKind::submanifold, spec_of(cube(3)));
  const backend::RelationView fwd =
      ops::relation_view(*rel, conv_relation_reads(RouteId::conv_implicit_gemm_sm80, ConvPass::forward));
  EXPECT_EQ(fwd.gemm_map, rel->gemm_map().data<std::int32_t>());
  EXPECT_EQ(fwd.gemm_order, rel->gemm_order().data<std::int32_t>());
  EXPECT_EQ(fwd.n_edges, 0);
  EXPECT_EQ(fwd.in_idx, nullptr);
  EXPECT_EQ(fwd.k_ptr, nullptr);
  EXPECT_EQ(fwd.out_ptr, nullptr);
  EXPECT_EQ(fwd.input_gemm_map, nullptr);
  EXPECT_EQ(rel->built_views(), unsigned{kViewGemmMap | kViewGemmOrder});

  const backend::RelationView dw =
      ops::relation_view(*rel, conv_relation_reads(RouteId::conv_implicit_gemm_sm80, ConvPass::weight_grad));
  EXPECT_EQ(dw.n_edges, rel->n_edges());
  EXPECT_NE(dw.k_ptr, nullptr);
  EXPECT_EQ(dw.input_gemm_map, nullptr);
  EXPECT_EQ(rel->built_views() & (kViewInputGemmMap | kViewInputGrouping), 0u);
  const backend::RelationView dx =
      ops::relation_view(*rel, conv_relation_reads(RouteId::conv_implicit_gemm_sm80, ConvPass::input_grad));
  EXPECT_EQ(dx.input_gemm_map, rel->input_gemm_map().data<std::int32_t>());
  EXPECT_EQ(dx.in_ptr, nullptr);  // the input grouping is for the CPU gather route only
  EXPECT_EQ(rel->built_views() & kViewInputGrouping, 0u);
  // Neither backward pass reads the output-major edge list (12 bytes per edge).
  EXPECT_EQ(dw.in_idx, nullptr);
  EXPECT_EQ(dx.in_idx, nullptr);
  EXPECT_EQ(dx.n_edges, rel->n_edges());
  EXPECT_EQ(rel->built_views() & kViewEdgeList, 0u);
  // Every view carries the count the relation already knows, as a hint.
  EXPECT_EQ(fwd.known_edges, -1);
  EXPECT_EQ(dx.known_edges, rel->n_edges());
}

// The views are functions of the map alone: built in any order (edge list first, or the input
// grouping and the count through the grouping first), on two independent builds of the same
// rows, they are equal array for array.
TEST(RelationViews, ViewsDoNotDependOnTheOrderTheyAreBuiltIn) {
  std::mt19937 rng(9);
  const auto rows = random_cloud(rng, 3000, 2, 12);
  auto [a, a_out] = relate(make_set(rows), RelationKind::submanifold, spec_of(cube(3)));
  auto [b, b_out] = relate(make_set(rows), RelationKind::submanifold, spec_of(cube(3)));
  a->n_edges();  // counted through the map
  a->in_idx();
  a->k_ptr();
  a->input_grouping();
  b->input_grouping();  // counted through the grouping
  b->in_idx();
  EXPECT_EQ(a->n_edges(), b->n_edges());
  for (auto get : {&Relation::in_idx, &Relation::out_idx, &Relation::k_idx, &Relation::k_in, &Relation::k_out})
    EXPECT_EQ(values<std::int32_t>(((*a).*get)()), values<std::int32_t>(((*b).*get)()));
  EXPECT_EQ(values<std::int64_t>(a->out_ptr()), values<std::int64_t>(b->out_ptr()));
  EXPECT_EQ(values<std::int64_t>(a->k_ptr()), values<std::int64_t>(b->k_ptr()));
  EXPECT_EQ(values<std::int64_t>(a->input_grouping().in_ptr), values<std::int64_t>(b->input_grouping().in_ptr));
  EXPECT_EQ(values<std::int32_t>(a->input_grouping().kt_in), values<std::int32_t>(b->input_grouping().kt_in));
  EXPECT_EQ(values<std::int32_t>(a->input_grouping().kt_out), values<std::int32_t>(b->input_grouping().kt_out));
  expect_consistent(*a);
  expect_consistent(*b);
}

// Where the geometry fixes the count (the identity, a k2 s2 partition), it is known at build time:
// no view has to be built (on a device: no read-back) to know it.
TEST(RelationViews, GeometryHintsKnowTheCountWithoutAnyView) {
  std::mt19937 rng(3);
  auto x = make_set(random_cloud(rng, 500, 2, 10));
  auto [one, one_out] = relate(x, RelationKind::submanifold, spec_of(cube(1)));
  EXPECT_TRUE(one->identity);
  EXPECT_EQ(one->known_edges(), x->size());
  auto [down, down_out] = relate(x, RelationKind::forward, spec_of(cube(2), cube(2)));
  EXPECT_EQ(down->known_edges(), x->size());
  EXPECT_EQ(down->built_views(), unsigned{kViewGemmMap | kViewEdgeCount});
  expect_consistent(*down);
}

// A transposed conv onto the skip reuses the forward relation's maps (nothing hashed, nothing
// copied): its map is forward's input-side map and the other way round, and its count is
// forward's. Its views equal those of a relation hashed from the transposed rule.
TEST(RelationViews, TransposeSharesTheForwardMaps) {
  std::mt19937 rng(13);
  auto fine = make_set(random_cloud(rng, 800, 2, 10));
  const KernelSpec spec = spec_of(cube(2), cube(2));
  auto [fwd, coarse] = relate(fine, RelationKind::forward, spec);
  auto [back, back_out] = relate(coarse, RelationKind::transposed_target, spec, fine);
  ASSERT_TRUE(back->transposed);
  EXPECT_EQ(back->gemm_map().raw_data(), fwd->input_gemm_map().raw_data());
  EXPECT_EQ(back->input_gemm_map().raw_data(), fwd->gemm_map().raw_data());
  EXPECT_EQ(back->known_edges(), fwd->known_edges());
  EXPECT_EQ(back->built_views() & (kViewEdgeList | kViewOffsetGrouping), 0u);
  // Hashed directly from a fresh copy of the coarse rows (no cached forward to transpose).
  auto hashed_in = make_set(rows_of(*coarse), coarse->stride());
  auto [hashed, hashed_out] = relate(hashed_in, RelationKind::transposed_target, spec, fine);
  ASSERT_FALSE(hashed->transposed);
  EXPECT_EQ(values<std::int32_t>(back->gemm_map()), values<std::int32_t>(hashed->gemm_map()));
  EXPECT_EQ(edges_of(*back), edges_of(*hashed));
  EXPECT_EQ(values<std::int32_t>(back->k_in()), values<std::int32_t>(hashed->k_in()));
  EXPECT_EQ(values<std::int32_t>(back->k_out()), values<std::int32_t>(hashed->k_out()));
  expect_consistent(*back);
}

TEST(Relation, GemmMapAndRowMasksSpanTwoWordsForK125) {
  std::mt19937 rng(11);
  auto x = make_set(random_cloud(rng, 300, 1, 4));
  auto [rel, out] = relate(x, RelationKind::submanifold, spec_of(cube(5)));
  EXPECT_EQ(rel->row_masks().dim(1), 2);
  expect_consistent(*rel);
  // The centre offset (k 62) of every row is itself.
  const auto m = values<std::int32_t>(rel->gemm_map());
  for (std::int64_t o = 0; o < rel->n_out; ++o) EXPECT_EQ(m[o * 125 + 62], o);
}

TEST(Relation, IdentityOnlyForKernelSizeOne) {
  auto x = make_set({{0, 0, 0, 0}, {0, 5, 0, 0}});
  EXPECT_TRUE(relate(x, RelationKind::submanifold, spec_of(cube(1))).relation->identity);
  EXPECT_TRUE(relate(x, RelationKind::forward, spec_of(cube(1))).relation->identity);
  EXPECT_FALSE(relate(x, RelationKind::submanifold, spec_of(cube(3))).relation->identity);
  // k1 onto a target holding the same rows in another order is not the identity.
  auto t = make_set({{0, 5, 0, 0}, {0, 0, 0, 0}});
  EXPECT_FALSE(relate(x, RelationKind::target, spec_of(cube(1)), t).relation->identity);
}

TEST(Relation, KernelSpecValidationNamesTheArgument) {
  auto x = make_set({{0, 0, 0, 0}});
  auto message = [&](RelationKind kind, const KernelSpec& spec) {
    return error_message<ValueError>([&] { relate(x, kind, spec); });
  };
  EXPECT_EQ(message(RelationKind::submanifold, spec_of({3, 2, 3})),
            "[test] kernel_size: expected odd sizes for a submanifold relation, got (3, 2, 3)");
  EXPECT_EQ(message(RelationKind::forward, spec_of({3, 0, 3})),
            "[test] kernel_size: expected positive sizes, got (3, 0, 3)");
  EXPECT_EQ(message(RelationKind::forward, spec_of(cube(3), {2, 0, 2})),
            "[test] stride: expected positive strides, got (2, 0, 2)");
  EXPECT_EQ(message(RelationKind::forward, spec_of(cube(3), cube(2), {0, 0, -1})),
            "[test] padding: expected non-negative padding, got (0, 0, -1)");
  EXPECT_EQ(message(RelationKind::forward, spec_of(cube(3), cube(1), {}, {1, 0, 1})),
            "[test] dilation: expected positive dilation, got (1, 0, 1)");
  EXPECT_EQ(message(RelationKind::forward, spec_of({2048, 1024, 1024})),
            "[test] kernel_size: expected a kernel volume below 2^31, got (2048, 1024, 1024)");
  EXPECT_EQ(x->cached_relation_count(), 0u);
}

// ---- empty sets ----------------------------------------------------------------------------

TEST(Relation, EmptyInputHasNoEdges) {
  auto x = make_set({});
  for (RelationKind kind : {RelationKind::submanifold, RelationKind::forward,
                            RelationKind::transposed, RelationKind::generative}) {
    SCOPED_TRACE(std::string(to_string(kind)));
    auto [rel, out] = relate(x, kind, spec_of(cube(3)));
    EXPECT_EQ(rel->n_out, 0);
    EXPECT_EQ(rel->n_edges(), 0);
    EXPECT_EQ(rel->in_idx().shape(), (Shape{0}));
    EXPECT_EQ(values<std::int64_t>(rel->out_ptr()), (std::vector<std::int64_t>{0}));
    EXPECT_EQ(values<std::int64_t>(rel->k_ptr()), std::vector<std::int64_t>(28, 0));
    EXPECT_EQ(rel->gemm_map().shape(), (Shape{0, 27}));
    EXPECT_EQ(rel->row_masks().shape(), (Shape{0, 1}));
  }
  auto [down, coarse] = relate(x, RelationKind::forward, spec_of(cube(2), cube(2)));
  EXPECT_EQ(coarse->size(), 0);
  EXPECT_EQ(coarse->stride(), cube(2));
}

TEST(Relation, EmptyTargetsAndTargetsWithoutInputs) {
  auto empty = make_set({});
  auto x = make_set({{0, 0, 0, 0}});
  auto t = make_set({{0, 0, 0, 0}, {0, 1, 1, 1}});
  auto [onto_empty, o1] = relate(x, RelationKind::target, spec_of(cube(3)), empty);
  EXPECT_EQ(onto_empty->n_out, 0);
  EXPECT_EQ(onto_empty->n_edges(), 0);
  auto [from_empty, o2] = relate(empty, RelationKind::target, spec_of(cube(3)), t);
  EXPECT_EQ(from_empty->n_out, 2);
  EXPECT_EQ(from_empty->n_edges(), 0);
  EXPECT_EQ(values<std::int64_t>(from_empty->out_ptr()), (std::vector<std::int64_t>{0, 0, 0}));
  EXPECT_EQ(values<std::int32_t>(from_empty->gemm_map()), std::vector<std::int32_t>(54, -1));
  expect_consistent(*from_empty);
}

// ---- int32 range ---------------------------------------------------------------------------

TEST(Relation, TransposedOutputBeyondInt32Raises) {
  // 2 * 1073741823 + 1 = 2147483647 still fits; 2 * 1073741824 does not.
  auto x = make_set({{0, 1073741823, 0, 0}, {0, 1073741824, 0, 0}}, cube(2));
  EXPECT_EQ(error_message<ValueError>(
                [&] { relate(x, RelationKind::transposed, spec_of(cube(2), cube(2))); }),
            "[test] coords: expected output coordinates within the int32 range "
            "[-2147483648, 2147483647], got 2147483648 at input row 1");
  auto neg = make_set({{0, 0, -1073741825, 0}}, cube(2));
  EXPECT_EQ(error_message<ValueError>(
                [&] { relate(neg, RelationKind::generative, spec_of(cube(2), cube(2))); }),
            "[test] coords: expected output coordinates within the int32 range "
            "[-2147483648, 2147483647], got -2147483650 at input row 0");
  EXPECT_EQ(x->cached_relation_count(), 0u);
}

TEST(Relation, ForwardExpandBeyondInt32Raises) {
  auto x = make_set({{0, 2147483647, 0, 0}});
  // The first kernel row (dx = -1) asks for o.x = 2147483647 + 1.
  EXPECT_EQ(error_message<ValueError>([&] {
              relate(x, RelationKind::forward, spec_of(cube(3), cube(1), {}, cube(1), true));
            }),
            "[test] coords: expected output coordinates within the int32 range "
            "[-2147483648, 2147483647], got 2147483648 at input row 0");
}

TEST(Relation, ExtremeInt32CoordinatesAreAccepted) {
  constexpr std::int32_t kMax = 2147483647;
  constexpr std::int32_t kMin = -2147483647 - 1;
  auto x = make_set(
      {{0, kMax, 0, 0}, {0, kMax - 1, 0, 0}, {0, kMin, kMin, kMax}, {0, kMin + 1, kMin, kMax}});
  auto [rel, out] = relate(x, RelationKind::submanifold, spec_of(cube(3)));
  // Neighbours across the extremes exist; looked-up coordinates beyond int32 simply do not.
  EXPECT_EQ(edges_of(*rel), (std::vector<Edge>{{1, 0, 4},
                                               {0, 0, 13},
                                               {1, 1, 13},
                                               {0, 1, 22},
                                               {2, 2, 13},
                                               {3, 2, 22},
                                               {2, 3, 4},
                                               {3, 3, 13}}));
  auto [down, coarse] = relate(x, RelationKind::forward, spec_of(cube(2), cube(2)));
  EXPECT_EQ(rows_of(*coarse),
            (std::vector<Row>{{0, 1073741823, 0, 0}, {0, -1073741824, -1073741824, 1073741823}}));
  expect_consistent(*down);
  EXPECT_EQ(x->lookup(0, kMin, kMin, kMax), 2);
  EXPECT_EQ(x->lookup(0, kMin, kMin, kMin), -1);
}

// ---- coordinate sets ----------------------------------------------------------------------

TEST(CoordinateSet, KeysAreUniqueAndNonZero) {
  auto a = make_set({{0, 0, 0, 0}});
  auto b = make_set({{0, 0, 0, 0}});
  EXPECT_NE(a->key(), 0u);
  EXPECT_NE(a->key(), b->key());  // equal values, different identities
}

TEST(CoordinateSet, LookupFindsRowsOrMinusOne) {
  auto x = make_set({{0, 1, 2, 3}, {1, 1, 2, 3}, {0, -4, 5, -6}});
  EXPECT_EQ(x->lookup(0, 1, 2, 3), 0);
  EXPECT_EQ(x->lookup(1, 1, 2, 3), 1);
  EXPECT_EQ(x->lookup(0, -4, 5, -6), 2);
  EXPECT_EQ(x->lookup(2, 1, 2, 3), -1);
  EXPECT_EQ(x->lookup(0, 1, 2, 4), -1);
}

TEST(CoordinateSet, DuplicateRowsRaiseNamingBothRows) {
  std::vector<Row> rows(9);
  for (std::int32_t r = 0; r < 9; ++r) rows[r] = {0, r, 0, 0};
  rows[2] = {0, 1, 2, 3};
  rows[7] = {0, 1, 2, 3};
  const std::string expected =
      "[conv3d] coords: expected unique rows, got row 7 (0, 1, 2, 3) equal to row 2";
  std::vector<std::int32_t> flat;
  for (const Row& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  const Array coords = Array::from_vector<std::int32_t>(flat, {9, 4});
  // Eagerly with `validate` ...
  EXPECT_EQ(error_message<ValueError>(
                [&] { CoordinateSet::create(coords, cube(1), std::nullopt, true, "conv3d"); }),
            expected);
  // ... or at the first op that builds the index, naming that op (and again on a retry).
  auto lazy = CoordinateSet::create(coords, cube(1));
  for (int attempt = 0; attempt < 2; ++attempt) {
    EXPECT_EQ(error_message<ValueError>([&] {
                lazy->relation(RelationKind::submanifold, spec_of(cube(3)), nullptr, "conv3d");
              }),
              expected);
  }
  // Duplicate target rows are rejected too.
  auto x = make_set({{0, 0, 0, 0}});
  EXPECT_EQ(error_message<ValueError>(
                [&] { x->relation(RelationKind::target, spec_of(cube(3)), lazy, "conv3d"); }),
            expected);
}

// The batch-id rule (docs/input_rules.md): negative ids raise at construction with `validate`
// (before the duplicate check, naming the first offending row); without it the set is created
// and ops that only key on the batch build their relations as for any other batch.
TEST(CoordinateSet, NegativeBatchIdsRaiseWhenValidating) {
  const Array coords = Array::from_vector<std::int32_t>({0, 0, 0, 0, -3, 1, 0, 0, -1, 2, 0, 0, -1, 2, 0, 0}, {4, 4});
  EXPECT_EQ(error_message<ValueError>(
                [&] { CoordinateSet::create(coords, cube(1), std::nullopt, true, "SparseTensor"); }),
            "[SparseTensor] coords: expected batch ids >= 0, got batch id -3 at row 1");
  const Array unique_rows = Array::from_vector<std::int32_t>({0, 0, 0, 0, -3, 1, 0, 0, -3, 2, 0, 0}, {3, 4});
  auto lazy = CoordinateSet::create(unique_rows, cube(1));
  const auto r = lazy->relation(RelationKind::submanifold, spec_of(cube(3)), nullptr, "subm_conv3d");
  EXPECT_EQ(r.relation->n_edges(), 3 + 2);  // three centres, and rows 1 and 2 of batch -3 are neighbours
}

TEST(CoordinateSet, RelationCacheReturnsTheSamePointer) {
  auto x = make_set({{0, 0, 0, 0}, {0, 1, 0, 0}, {0, 3, 3, 3}});
  auto first = relate(x, RelationKind::forward, spec_of(cube(2), cube(2)));
  auto second = relate(x, RelationKind::forward, spec_of(cube(2), cube(2)));
  EXPECT_EQ(first.relation, second.relation);
  EXPECT_EQ(first.output, second.output);
  EXPECT_EQ(x->cached_relation_count(), 1u);

  auto other = relate(x, RelationKind::forward, spec_of(cube(3), cube(2)));
  EXPECT_NE(other.relation, first.relation);
  EXPECT_NE(other.output->key(), first.output->key());
  EXPECT_EQ(x->cached_relation_count(), 2u);

  // Output = this set is handed back as the set itself (not a copy) on both calls.
  EXPECT_EQ(relate(x, RelationKind::submanifold, spec_of(cube(3))).output, x);
  EXPECT_EQ(relate(x, RelationKind::submanifold, spec_of(cube(3))).output, x);
  EXPECT_EQ(x->cached_relation_count(), 3u);

  // Targets are part of the key: equal values in another set are another relation.
  auto t1 = make_set({{0, 0, 0, 0}}, cube(2));
  auto t2 = make_set({{0, 0, 0, 0}}, cube(2));
  auto r1 = relate(x, RelationKind::target, spec_of(cube(2), cube(2)), t1);
  auto r2 = relate(x, RelationKind::target, spec_of(cube(2), cube(2)), t2);
  EXPECT_EQ(r1.output, t1);
  EXPECT_EQ(r2.output, t2);
  EXPECT_NE(r1.relation, r2.relation);
  EXPECT_EQ(relate(x, RelationKind::target, spec_of(cube(2), cube(2)), t1).relation, r1.relation);
  EXPECT_EQ(x->cached_relation_count(), 5u);
}

TEST(CoordinateSet, CachedRelationsDoNotKeepTheInputAlive) {
  std::weak_ptr<CoordinateSet> weak_input, weak_target;
  {
    auto x = make_set({{0, 0, 0, 0}, {0, 1, 1, 1}});
    auto t = make_set({{0, 0, 0, 0}});
    relate(x, RelationKind::submanifold, spec_of(cube(3)));
    relate(x, RelationKind::target, spec_of(cube(3)), t);
    relate(t, RelationKind::target, spec_of(cube(3)), x);
    weak_input = x;
    weak_target = t;
  }
  EXPECT_TRUE(weak_input.expired());
  EXPECT_TRUE(weak_target.expired());
}

TEST(CoordinateSet, MakesNonContiguousCoordsContiguous) {
  // A (3, 4) view with transposed strides over a (4, 3) buffer.
  const std::vector<std::int32_t> buffer{0, 0, 0, 1, 2, 3, 2, 4, 6, 3, 6, 9};
  auto owner = std::make_shared<std::vector<std::int32_t>>(buffer);
  const Array view = Array::wrap(owner->data(), {3, 4}, {1, 3}, Dtype::i32, Device::cpu(), owner);
  ASSERT_FALSE(view.is_contiguous());
  auto x = CoordinateSet::create(view, cube(1));
  EXPECT_TRUE(x->coords().is_contiguous());
  EXPECT_EQ(rows_of(*x), (std::vector<Row>{{0, 1, 2, 3}, {0, 2, 4, 6}, {0, 3, 6, 9}}));
  EXPECT_EQ(x->lookup(0, 2, 4, 6), 1);
}

TEST(CoordinateSet, RejectsUndefinedCoordsAndCudaCoordsWithoutCuda) {
  EXPECT_EQ(error_message<ValueError>([] { CoordinateSet::create(Array(), cube(1)); }),
            "[SparseTensor] coords: expected an (N, 4) int32 array, got an undefined array");
  // Host memory labelled as a CUDA array (wrap never touches it, nor does create without
  // validation): accepted by a CUDA build, rejected before any access otherwise.
  auto owner = std::make_shared<std::vector<std::int32_t>>(4, 0);
  const Array on_gpu = Array::wrap(owner->data(), {1, 4}, {}, Dtype::i32, Device::cuda(0), owner);
  if (backend::device_caps().cuda.built) {
    EXPECT_EQ(CoordinateSet::create(on_gpu, cube(1))->coords().device(), Device::cuda(0));
  } else {
    EXPECT_EQ(error_message<UnsupportedError>([&] { CoordinateSet::create(on_gpu, cube(1)); }),
              "[SparseTensor] coords: expected cpu coordinates (cuda:0 needs the CUDA backend), got cuda:0 "
              "(built without CUDA)");
  }
}

TEST(CoordinateSet, RejectsWrongDtype) {
  const Array coords = Array::from_vector<float>({0, 0, 0, 0}, {1, 4});
  EXPECT_EQ(error_message<TypeError>([&] { CoordinateSet::create(coords, cube(1)); }),
            "[SparseTensor] coords: expected int32 coordinates, got float32");
}

TEST(CoordinateSet, RejectsWrongShape) {
  EXPECT_EQ(error_message<ValueError>([] {
              CoordinateSet::create(Array::from_vector<std::int32_t>({0, 0, 0, 0, 0, 0}, {2, 3}),
                                    cube(1));
            }),
            "[SparseTensor] coords: expected shape (N, 4), got (2, 3)");
  EXPECT_EQ(error_message<ValueError>([] {
              CoordinateSet::create(Array::from_vector<std::int32_t>({0, 0, 0, 0}, {4}), cube(1));
            }),
            "[SparseTensor] coords: expected shape (N, 4), got (4,)");
}

TEST(CoordinateSet, RejectsNonPositiveStride) {
  EXPECT_EQ(error_message<ValueError>([] {
              make_set({{0, 0, 0, 0}}, {1, 0, 1});
            }),
            "[SparseTensor] stride: expected positive integers, got (1, 0, 1)");
}

TEST(CoordinateSet, RejectsBadBatchCounts) {
  const std::vector<Row> rows{{0, 0, 0, 0}, {1, 0, 0, 0}, {1, 1, 0, 0}};
  EXPECT_EQ(error_message<ValueError>([&] {
              make_set(rows, cube(1), std::vector<std::int64_t>{4, -1});
            }),
            "[SparseTensor] batch_counts: expected non-negative counts, got -1 at batch 1");
  EXPECT_EQ(error_message<ValueError>([&] {
              make_set(rows, cube(1), std::vector<std::int64_t>{1, 1});
            }),
            "[SparseTensor] batch_counts: expected counts summing to N = 3, got sum 2");
  EXPECT_EQ(error_message<ValueError>([&] {
              make_set(rows, cube(1), std::vector<std::int64_t>{1, 4611686018427387904});
            }),
            "[SparseTensor] batch_counts: expected counts summing to N = 3, got a sum above N");
  EXPECT_EQ(error_message<ValueError>([&] {
              make_set(rows, cube(1), std::vector<std::int64_t>{2, 1});
            }),
            "[SparseTensor] batch_counts: expected batch_counts[0] == 1 (the rows of batch 0 in "
            "coords), got 2");
  EXPECT_EQ(
      error_message<ValueError>([&] { make_set(rows, cube(1), std::vector<std::int64_t>{3}); }),
      "[SparseTensor] coords: expected batch ids in [0, 1) (len(batch_counts)), got batch "
      "id 1 at row 1");
  // Empty batches are allowed.
  EXPECT_EQ(make_set(rows, cube(1), std::vector<std::int64_t>{1, 2, 0})->size(), 3);
}

}  // namespace
}  // namespace lattice
