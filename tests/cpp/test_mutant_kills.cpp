// Tests written to kill mutants of tests/mutants/ that the rest of the C++ suite let survive
// (docs/testing.md lists which test kills which mutant).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "lattice/ops/algebra.h"

namespace lattice {
namespace {

Array line_coords(const std::vector<std::int32_t>& xs) {
  std::vector<std::int32_t> flat;
  for (std::int32_t x : xs) flat.insert(flat.end(), {0, x, 0, 0});
  return Array::from_vector(flat, {static_cast<std::int64_t>(xs.size()), 4});
}

Array column(const std::vector<double>& v) {
  return Array::from_vector(v, {static_cast<std::int64_t>(v.size()), 1});
}

std::vector<double> values(const Array& a) {
  return std::vector<double>(a.data<double>(), a.data<double>() + a.numel());
}

// Kills algebra_default_join_sub. The Python front end passes its own default join, so only the
// C++ API reaches ops::default_join: add and sub are outer joins (SEMANTICS.md), the other ops
// inner. lhs x = 0, 1, 2 (1, 2, 3) and rhs x = 2, 5, 1 (10, 20, 30): outer rows x = 0, 1, 2, 5.
TEST(MutantKillsAlgebra, DefaultJoinsOfEveryOp) {
  EXPECT_EQ(ops::default_join(AlgebraOp::add), Join::outer);
  EXPECT_EQ(ops::default_join(AlgebraOp::sub), Join::outer);
  EXPECT_EQ(ops::default_join(AlgebraOp::mul), Join::inner);
  EXPECT_EQ(ops::default_join(AlgebraOp::maximum), Join::inner);
  EXPECT_EQ(ops::default_join(AlgebraOp::minimum), Join::inner);
  EXPECT_EQ(ops::default_join(AlgebraOp::cat), Join::inner);

  const SparseTensor lhs{line_coords({0, 1, 2}), column({1, 2, 3})};
  const SparseTensor rhs{line_coords({2, 5, 1}), column({10, 20, 30})};
  const SparseTensor d = ops::sparse_sub(lhs, rhs);
  EXPECT_EQ(values(d.feats()), (std::vector<double>{1, -28, -7, -20}));
  EXPECT_EQ(d.coords().dim(0), 4);
}

}  // namespace
}  // namespace lattice
