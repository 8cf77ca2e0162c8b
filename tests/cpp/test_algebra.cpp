// Specification tests of the C++ sparse-algebra and coordinate-utility API (include/lattice/ops/
// algebra.h, coords.h): the route tables, joins on a hand-computed line, the output identity
// rule, the two routes against each other, gradients, lookups, downsampling and Morton codes.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "lattice/core/error.h"
#include "lattice/ops/algebra.h"
#include "lattice/ops/coords.h"
#include "lattice/route/route.h"

namespace lattice {
namespace {

Array coords_of(const std::vector<std::vector<std::int32_t>>& rows) {
  std::vector<std::int32_t> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  return Array::from_vector(flat, {static_cast<std::int64_t>(rows.size()), 4});
}

Array column(const std::vector<double>& v) {
  return Array::from_vector(v, {static_cast<std::int64_t>(v.size()), 1});
}

std::vector<double> values(const Array& a) {
  return std::vector<double>(a.data<double>(), a.data<double>() + a.numel());
}

std::vector<std::int64_t> rows_of(const Array& a) {
  return std::vector<std::int64_t>(a.data<std::int64_t>(), a.data<std::int64_t>() + a.numel());
}

std::vector<std::int32_t> x_of(const Array& coords) {
  std::vector<std::int32_t> out;
  for (std::int64_t r = 0; r < coords.dim(0); ++r)
    out.push_back(coords.data<std::int32_t>()[4 * r + 1]);
  return out;
}

// Three points on a line each: lhs x = 0, 1, 2 and rhs x = 2, 5, 1.
struct AlgebraLine : ::testing::Test {
  SparseTensor lhs{coords_of({{0, 0, 0, 0}, {0, 1, 0, 0}, {0, 2, 0, 0}}), column({1, 2, 3})};
  SparseTensor rhs{coords_of({{0, 2, 0, 0}, {0, 5, 0, 0}, {0, 1, 0, 0}}), column({10, 20, 30})};
};

TEST_F(AlgebraLine, JoinsProduceTheSemanticsRowsOnBothRoutes) {
  struct Case {
    Join join;
    std::vector<std::int32_t> x;
    std::vector<std::int64_t> l, r;
  };
  const std::vector<Case> cases = {
      {Join::inner, {1, 2}, {1, 2}, {2, 0}},
      {Join::left, {0, 1, 2}, {0, 1, 2}, {-1, 2, 0}},
      {Join::right, {2, 5, 1}, {2, -1, 1}, {0, 1, 2}},
      {Join::outer, {0, 1, 2, 5}, {0, 1, 2, -1}, {-1, 2, 0, 1}},
  };
  for (RouteId route : {RouteId::algebra_hashed, RouteId::algebra_reference}) {
    for (const Case& c : cases) {
      const auto a = ops::align("sparse_add", lhs.coordinate_set(), rhs.coordinate_set(), c.join,
                                RoutePolicy{route});
      EXPECT_EQ(x_of(a->output->coords()), c.x) << to_string(c.join);
      EXPECT_EQ(rows_of(a->lhs_rows), c.l) << to_string(c.join);
      EXPECT_EQ(rows_of(a->rhs_rows), c.r) << to_string(c.join);
    }
  }
}

TEST_F(AlgebraLine, OpsCombineWithDefaultJoinsAndFill) {
  EXPECT_EQ(values(ops::sparse_add(lhs, rhs).feats()), (std::vector<double>{1, 32, 13, 20}));
  EXPECT_EQ(values(ops::sparse_mul(lhs, rhs).feats()), (std::vector<double>{60, 30}));
  ops::AlgebraOptions o;
  o.join = Join::outer;
  o.fill = -1;
  EXPECT_EQ(values(ops::sparse_maximum(lhs, rhs, o).feats()), (std::vector<double>{1, 30, 10, 20}));
  EXPECT_EQ(values(ops::sparse_minimum(lhs, rhs, o).feats()), (std::vector<double>{-1, 2, 3, -1}));
  EXPECT_EQ(values(ops::sparse_sub(lhs, rhs, {.join = Join::left}).feats()),
            (std::vector<double>{1, -28, -7}));
  EXPECT_EQ(values(ops::sparse_cat_aligned(lhs, rhs).feats()), (std::vector<double>{2, 30, 3, 10}));
}

TEST_F(AlgebraLine, OutputIdentityRule) {
  EXPECT_EQ(ops::sparse_add(lhs, rhs, {.join = Join::left}).key(), lhs.key());
  EXPECT_EQ(ops::sparse_add(lhs, rhs, {.join = Join::right}).key(), rhs.key());
  const SparseTensor fresh = ops::sparse_add(lhs, rhs);
  EXPECT_NE(fresh.key(), lhs.key());
  EXPECT_NE(fresh.key(), rhs.key());
  const auto same =
      ops::align("sparse_add", lhs.coordinate_set(), lhs.coordinate_set(), Join::inner);
  EXPECT_TRUE(same->identity);
  EXPECT_FALSE(same->lhs_rows.defined());
  EXPECT_EQ(same->output->key(), lhs.key());
}

TEST_F(AlgebraLine, BackwardGathersGradientsAndZeroesAbsentRows) {
  const auto a = ops::align("sparse_mul", lhs.coordinate_set(), rhs.coordinate_set(), Join::inner);
  const Array g = column({1, 1});
  const ops::CombineGrads grads =
      ops::combine_backward(*a, AlgebraOp::mul, lhs.feats(), rhs.feats(), g, true, true);
  EXPECT_EQ(values(grads.lhs), (std::vector<double>{0, 30, 10}));  // d(l*r)/dl = r
  EXPECT_EQ(values(grads.rhs), (std::vector<double>{3, 0, 2}));
}

TEST_F(AlgebraLine, ValidationNamesOpAndArgument) {
  const SparseTensor strided(coords_of({{0, 0, 0, 0}}), column({1}), Int3{2, 2, 2});
  try {
    ops::sparse_add(lhs, strided);
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_EQ(
        std::string(e.what()),
        "[sparse_add] rhs: expected stride (1, 1, 1) (the stride of lhs), got stride (2, 2, 2)");
  }
  const SparseTensor wide(coords_of({{0, 0, 0, 0}}), Array::zeros({1, 2}, Dtype::f64));
  EXPECT_THROW(ops::sparse_mul(lhs, wide), ValueError);
  const SparseTensor single(coords_of({{0, 0, 0, 0}}), Array::zeros({1, 1}, Dtype::f32));
  EXPECT_THROW(ops::sparse_mul(lhs, single), TypeError);
}

// The feature and gradient checks the Python front end cannot reach (its SparseTensor and
// autograd already guarantee them).
TEST_F(AlgebraLine, CombineValidatesFeaturesAndGradients) {
  const auto a = ops::align("sparse_add", lhs.coordinate_set(), rhs.coordinate_set(), Join::outer);
  auto message = [&](auto&& call) {
    try {
      call();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message([&] { ops::combine_forward(*a, AlgebraOp::add, Array(), rhs.feats()); }),
            "[sparse_add] lhs: expected an (N=3, C) float array, got nothing");
  EXPECT_EQ(message([&] {
              ops::combine_forward(*a, AlgebraOp::add, column({1, 2}), rhs.feats());
            }),
            "[sparse_add] lhs: expected shape (N=3, C), got (2, 1)");
  EXPECT_EQ(
      message([&] {
        ops::combine_forward(*a, AlgebraOp::add, lhs.feats(), Array::zeros({3, 1}, Dtype::i32));
      }),
      "[sparse_add] rhs: expected float16, bfloat16, float32 or float64 features, got int32");
  EXPECT_EQ(message([&] {
              ops::combine_backward(*a, AlgebraOp::add, lhs.feats(), rhs.feats(), column({1}), true,
                                    true);
            }),
            "[sparse_add] grad_out: expected shape (M=4, C=1), got (1, 1)");
  EXPECT_EQ(message([&] {
              ops::combine_backward(*a, AlgebraOp::add, lhs.feats(), rhs.feats(),
                                    Array::zeros({4, 1}, Dtype::f32), true, true);
            }),
            "[sparse_add] grad_out: expected float64 (the dtype of lhs), got float32");
  EXPECT_EQ(message([&] {
              ops::combine_backward(*a, AlgebraOp::add, lhs.feats(), rhs.feats(), Array(), true,
                                    true);
            }),
            "[sparse_add] grad_out: expected an (M, C) array, got nothing");
  EXPECT_EQ(message([&] { ops::align("sparse_add", lhs.coordinate_set(), nullptr, Join::inner); }),
            "[sparse_add] rhs: expected a coordinate set, got none");
  EXPECT_EQ(message([&] {
              ops::morton_codes(Array::zeros({2, 2}, Dtype::i32));
            }),
            "[morton_codes] coords: expected shape (N, 3) or (N, 4), got (2, 2)");
  EXPECT_EQ(message([&] {
              ops::downsample_coords(Array::zeros({2, 4}, Dtype::i64), {1, 1, 1});
            }),
            "[downsample_coords] coords: expected int32 coordinates, got int64");
  EXPECT_EQ(message([&] { ops::lookup_coords(lhs.coordinate_set(), Array()); }),
            "[lookup_coords] queries: expected an int32 array of shape (N, 4), got nothing");
  EXPECT_EQ(message([&] { ops::explain_coords("nope", lhs.coords()); }),
            "[explain] op: expected downsample_coords, morton_codes, morton_order, prune, crop, "
            "sparse_collate, dense or from_dense, got 'nope'");
}

TEST(AlgebraRoutes, HashedIsPreferredAndBothAdmitCpu) {
  AlgebraProblem p;
  p.pass = AlgebraPass::forward;
  p.dtype = Dtype::f16;
  DeviceCaps caps;
  const Explanation e = explain(p, caps);
  ASSERT_TRUE(e.chosen.has_value());
  EXPECT_EQ(*e.chosen, RouteId::algebra_hashed);
  ASSERT_EQ(e.rows.size(), 3u);  // hashed, cuda_hashed (rejected: the data is on the CPU), reference
  EXPECT_FALSE(e.row(RouteId::algebra_cuda_hashed)->verdict.admitted);
  EXPECT_TRUE(e.row(RouteId::algebra_reference)->verdict.admitted);
  p.dtype = Dtype::i32;
  EXPECT_FALSE(explain(p, caps).chosen.has_value());  // combine needs a float dtype
  p.pass = AlgebraPass::align;
  EXPECT_TRUE(explain(p, caps).chosen.has_value());
  p.device = Device::cuda(0);
  EXPECT_FALSE(explain(p, caps).chosen.has_value());
  EXPECT_EQ(route_from_string("algebra", "hashed"), RouteId::algebra_hashed);
  EXPECT_EQ(route_from_string("coords", "reference"), RouteId::coords_reference);
  EXPECT_EQ(op_family(RouteId::algebra_reference), "algebra");
}

TEST(AlgebraRoutes, HashedEqualsReferenceOnRandomSets) {
  std::mt19937 gen(7);
  std::uniform_int_distribution<std::int32_t> coord(-6, 6), batch(0, 2);
  auto random_set = [&](int n) {
    std::set<std::tuple<int, int, int, int>> seen;
    std::vector<std::vector<std::int32_t>> rows;
    while (static_cast<int>(rows.size()) < n) {
      std::vector<std::int32_t> r{batch(gen), coord(gen), coord(gen), coord(gen)};
      if (seen.insert({r[0], r[1], r[2], r[3]}).second) rows.push_back(r);
    }
    return CoordinateSet::create(coords_of(rows), {1, 1, 1});
  };
  const auto a = random_set(3000), b = random_set(2500);
  for (Join join : {Join::inner, Join::left, Join::right, Join::outer}) {
    const auto h = ops::align("sparse_add", a, b, join, {RouteId::algebra_hashed});
    const auto r = ops::align("sparse_add", a, b, join, {RouteId::algebra_reference});
    EXPECT_EQ(rows_of(h->lhs_rows), rows_of(r->lhs_rows)) << to_string(join);
    EXPECT_EQ(rows_of(h->rhs_rows), rows_of(r->rhs_rows)) << to_string(join);
  }
  const Array q = b->coords();
  EXPECT_EQ(rows_of(ops::lookup_coords(a, q, {RouteId::algebra_hashed})),
            rows_of(ops::lookup_coords(a, q, {RouteId::algebra_reference})));
}

TEST(AlgebraCoords, DownsampleFloorDividesInFirstOccurrenceOrder) {
  const ops::DownsampleOutput d = ops::downsample_coords(
      coords_of({{0, -1, 0, 3}, {0, -2, 1, 2}, {1, -1, 0, 3}, {0, 1, 0, 3}, {0, 0, 1, 2}}),
      {2, 2, 4});
  EXPECT_EQ(x_of(d.coords), (std::vector<std::int32_t>{-1, -1, 0}));
  EXPECT_EQ(rows_of(d.inverse), (std::vector<std::int64_t>{0, 0, 1, 2, 2}));
}

TEST(AlgebraCoords, MortonCodesInterleaveAndRejectOutOfRange) {
  const Array codes =
      ops::morton_codes(coords_of({{0, 0, 0, 0}, {0, -(1 << 20) + 1, -(1 << 20), -(1 << 20)}}));
  EXPECT_EQ(rows_of(codes), (std::vector<std::int64_t>{std::int64_t{7} << 60, 4}));
  EXPECT_THROW(ops::morton_codes(coords_of({{0, 1 << 20, 0, 0}})), ValueError);
  EXPECT_EQ(rows_of(ops::morton_order(coords_of({{1, 0, 0, 0}, {0, 1, 0, 0}, {0, 0, 0, 0}}))),
            (std::vector<std::int64_t>{2, 1, 0}));
}

// prune / crop / sparse_collate / dense / from_dense row layouts on the coords reference route.
TEST(CoordsRows, PruneCropCollateDenseNonzeroHandComputed) {
  const Array c = coords_of({{0, 0, 0, 0}, {0, 1, 0, 0}, {1, 2, 0, 0}, {1, -1, 0, 0}});
  EXPECT_EQ(rows_of(ops::prune_rows(c, Array::from_vector<std::uint8_t>({1, 0, 0, 1}))),
            (std::vector<std::int64_t>{0, 3}));
  EXPECT_EQ(rows_of(ops::crop_rows(c, {0, 0, 0}, {2, 1, 1})), (std::vector<std::int64_t>{0, 1}));
  EXPECT_EQ(ops::crop_rows(c, {0, 0, 0}, {0, 1, 1}).dim(0), 0);
  const Array xyz = Array::from_vector<std::int32_t>({7, 8, 9}, {1, 3});
  const ops::CollateOutput col = ops::collate_coords({xyz, c});
  EXPECT_EQ(col.counts, (std::vector<std::int64_t>{1, 4}));
  const auto* cc = col.coords.data<std::int32_t>();
  EXPECT_EQ((std::vector<std::int32_t>(cc, cc + 8)),
            (std::vector<std::int32_t>{0, 7, 8, 9, 1, 0, 0, 0}));
  EXPECT_EQ(col.coords.dim(0), 5);
  EXPECT_EQ(cc[4 * 4], 1);  // a sample's own batch column is replaced by its index
  // (B=2, X=4, Y=1, Z=1) grid with origin x = -1: flat = (b * 4 + x + 1).
  EXPECT_EQ(rows_of(ops::dense_index(c, {-1, 0, 0}, {4, 1, 1})),
            (std::vector<std::int64_t>{1, 2, 7, 4}));
  const ops::NonzeroOutput nz = ops::nonzero_sites(
      Array::from_vector<std::uint8_t>({0, 1, 0, 0, 1, 1, 0, 0}, {2, 2, 2, 1}), {5, 0, 0});
  EXPECT_EQ(rows_of(nz.index), (std::vector<std::int64_t>{1, 4, 5}));
  EXPECT_EQ(nz.counts, (std::vector<std::int64_t>{1, 2}));
  const auto* nc = nz.coords.data<std::int32_t>();
  EXPECT_EQ((std::vector<std::int32_t>(nc, nc + 12)),
            (std::vector<std::int32_t>{0, 5, 1, 0, 1, 5, 0, 0, 1, 5, 1, 0}));
  EXPECT_EQ(ops::explain_coords("sparse_collate", 5).chosen, RouteId::coords_reference);
}

// The validation the Python front end reaches first (same wording) or cannot reach.
TEST(CoordsRows, ValidationNamesOpAndArgument) {
  auto message = [&](auto&& call) {
    try {
      call();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const Array c = coords_of({{0, 0, 0, 0}, {0, 1, 0, 0}});
  EXPECT_EQ(message([&] { ops::prune_rows(c, Array::zeros({2}, Dtype::f32)); }),
            "[prune] mask: expected a bool array, got float32");
  EXPECT_EQ(message([&] { ops::prune_rows(c, Array::zeros({3}, Dtype::u8)); }),
            "[prune] mask: expected shape (N=2,), got (3,)");
  EXPECT_EQ(message([&] { ops::crop_rows(c, {0, 0, 0}, {1, -1, 1}); }),
            "[crop] hi: expected values >= lo (0, 0, 0) on every axis, got (1, -1, 1)");
  EXPECT_EQ(message([&] { ops::collate_coords({}); }),
            "[sparse_collate] samples: expected at least one sample, got an empty sequence");
  EXPECT_EQ(message([&] { ops::collate_coords({c, Array::zeros({2, 2}, Dtype::i32)}); }),
            "[sparse_collate] samples[1] coords: expected shape (N, 3) or (N, 4), got (2, 2)");
  EXPECT_EQ(message([&] { ops::dense_index(c, {0, 0, 0}, {-1, 1, 1}); }),
            "[dense] shape: expected non-negative sizes, got (-1, 1, 1)");
  EXPECT_EQ(message([&] { ops::dense_index(coords_of({{-1, 0, 0, 0}}), {0, 0, 0}, {1, 1, 1}); }),
            "[dense] coords: expected batch ids >= 0, got batch id -1 at row 0");
  EXPECT_EQ(message([&] { ops::dense_index(c, {0, 0, 0}, {1, 1, 1}); }),
            "[dense] coords: expected x, y, z within [origin, origin + shape) with origin "
            "(0, 0, 0) and shape (1, 1, 1), got row 1 (0, 1, 0, 0)");
  EXPECT_EQ(message([&] { ops::nonzero_sites(Array::zeros({2, 2}, Dtype::u8), {0, 0, 0}); }),
            "[from_dense] dense: expected shape (B, X, Y, Z), got (2, 2)");
  EXPECT_EQ(message([&] { ops::nonzero_sites(Array::zeros({1, 1, 1, 1}, Dtype::i32), {0, 0, 0}); }),
            "[from_dense] dense: expected a bool array, got int32");
  EXPECT_EQ(message([&] {
              ops::nonzero_sites(Array::zeros({1, 2, 1, 1}, Dtype::u8), {2147483647, 0, 0});
            }),
            "[from_dense] origin: expected origin + shape within int32, got (2147483647, 0, 0)");
  EXPECT_EQ(message([&] { ops::explain_coords("nope", 1); }).substr(0, 24),
            "[explain] op: expected d");
}

}  // namespace
}  // namespace lattice
