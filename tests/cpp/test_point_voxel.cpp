// Specification tests of the point <-> voxel family through the public C++ API
// (include/lattice/ops/point_voxel.h): the route table, voxelize / devoxelize forward and
// backward on hand cases, and the parallel route bitwise equal to the reference.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "lattice/lattice.h"

namespace lattice {
namespace {

Array points_of(const std::vector<double>& xyz) {
  return Array::from_vector(xyz, {static_cast<std::int64_t>(xyz.size() / 3), 3});
}

std::vector<double> values(const Array& a) {
  const double* p = a.data<double>();
  return {p, p + a.numel()};
}

RoutePolicy force(RouteId id) { return RoutePolicy{.force = id}; }

TEST(PointVoxelRoutes, ParallelPreferredReferenceAdmittedCudaRejected) {
  DeviceCaps caps;
  caps.cpu.threads = 2;
  PointVoxelProblem p;
  p.op = "devoxelize";
  p.dtype = Dtype::bf16;
  Explanation e = explain(p, caps);
  ASSERT_TRUE(e.chosen.has_value());
  EXPECT_EQ(*e.chosen, RouteId::point_voxel_parallel);
  EXPECT_EQ(std::string(op_family(RouteId::point_voxel_reference)), "point_voxel");
  EXPECT_EQ(route_from_string("point_voxel", "parallel"), RouteId::point_voxel_parallel);
  p.device = Device::cuda(0);
  e = explain(p, caps);
  EXPECT_FALSE(e.chosen.has_value());
  EXPECT_NE(e.to_string().find("runs on cpu"), std::string::npos);
  p.device = Device::cpu();
  p.pass = PointVoxelPass::build_map;
  p.dtype = Dtype::f16;
  EXPECT_FALSE(explain(p, caps).chosen.has_value());
}

TEST(PointVoxelOps, VoxelizeMaxTiesAndGradientGoToTheFirstPoint) {
  const Array pts = points_of({0.1, 0.1, 0.1, 0.2, 0.2, 0.2, -0.5, 0.0, 0.0});
  const Array feats = Array::from_vector(std::vector<double>{5, 1, 5, 2, 7, 7}, {3, 2});
  const ops::PointGrouping g = ops::group_points(pts, {});
  ASSERT_EQ(g.n_voxels(), 2);
  const ops::VoxelizeForward f = ops::voxelize_forward(g, feats, PointReduction::max);
  EXPECT_EQ(values(f.feats), (std::vector<double>{5, 2, 7, 7}));
  const Array dy = Array::from_vector(std::vector<double>{1, 2, 3, 4}, {2, 2});
  EXPECT_EQ(values(ops::voxelize_backward(g, dy, f.argmax, PointReduction::max)),
            (std::vector<double>{1, 0, 0, 2, 3, 4}));
  EXPECT_EQ(values(ops::voxelize_backward(g, dy, {}, PointReduction::mean)),
            (std::vector<double>{0.5, 1, 0.5, 1, 3, 4}));
}

TEST(PointVoxelOps, TrilinearDevoxelizeRenormalisesAndBackwardIsTheTranspose) {
  const Array coords =
      Array::from_vector(std::vector<std::int32_t>{0, 0, 0, 0, 0, 1, 0, 0}, {2, 4});
  const SparseTensor v(coords, Array::from_vector(std::vector<double>{1, 3}, {2, 1}));
  ops::PointVoxelMapOptions o;
  o.mode = PointVoxelMode::trilinear;
  // (0.75, .5, .5): raw weights 0.75 / 0.25 on x; (5, 5, 5): no voxel around it
  const auto map =
      ops::build_point_voxel_map(points_of({0.75, 0.5, 0.5, 5, 5, 5}), v.coordinate_set(), o);
  EXPECT_EQ(values(ops::devoxelize(v, *map)), (std::vector<double>{1.5, 0.0}));
  const Array dy = Array::from_vector(std::vector<double>{4, 100}, {2, 1});
  EXPECT_EQ(values(ops::devoxelize_backward(*map, dy)), (std::vector<double>{3, 1}));
}

TEST(PointVoxelOps, ParallelRouteIsBitwiseTheReference) {
  std::mt19937 gen(3);
  std::uniform_real_distribution<float> u(-3, 3);
  const std::int64_t n = 20000, c = 4;
  std::vector<float> xyz(n * 3), f(n * c);
  for (auto& x : xyz) x = u(gen);
  for (auto& x : f) x = u(gen);
  const Array pts = Array::from_vector(xyz, {n, 3});
  const Array feats = Array::from_vector(f, {n, c});
  ops::QuantizeOptions q;
  q.voxel_size = {0.25, 0.25, 0.25};
  const ops::PointGrouping g = ops::group_points(pts, q);
  for (auto r : {PointReduction::sum, PointReduction::mean, PointReduction::max}) {
    const auto a = ops::voxelize_forward(g, feats, r, force(RouteId::point_voxel_reference));
    const auto b = ops::voxelize_forward(g, feats, r, force(RouteId::point_voxel_parallel));
    const float* pa = a.feats.data<float>();
    const float* pb = b.feats.data<float>();
    EXPECT_TRUE(std::equal(pa, pa + a.feats.numel(), pb)) << to_string(r);
  }
  const SparseTensor v(g.voxels, ops::voxelize_forward(g, feats, PointReduction::mean).feats);
  ops::PointVoxelMapOptions o;
  o.voxel_size = q.voxel_size;
  o.mode = PointVoxelMode::trilinear;
  const auto map = ops::build_point_voxel_map(pts, v.coordinate_set(), o);
  const Array ya = ops::devoxelize(v, *map, force(RouteId::point_voxel_reference));
  const Array yb = ops::devoxelize(v, *map, force(RouteId::point_voxel_parallel));
  EXPECT_TRUE(std::equal(ya.data<float>(), ya.data<float>() + ya.numel(), yb.data<float>()));
  const Array da = ops::devoxelize_backward(*map, feats, force(RouteId::point_voxel_reference));
  const Array db = ops::devoxelize_backward(*map, feats, force(RouteId::point_voxel_parallel));
  EXPECT_TRUE(std::equal(da.data<float>(), da.data<float>() + da.numel(), db.data<float>()));
}

TEST(PointVoxelOps, DevoxelizeWithAMapOfOtherCoordinatesRaisesValueError) {
  const Array coords = Array::from_vector(std::vector<std::int32_t>{0, 0, 0, 0}, {1, 4});
  const SparseTensor a(coords, Array::zeros({1, 1}, Dtype::f32));
  const SparseTensor b(coords, Array::zeros({1, 1}, Dtype::f32));
  const auto map = ops::build_point_voxel_map(points_of({0.5, 0.5, 0.5}), a.coordinate_set(), {});
  EXPECT_THROW(ops::devoxelize(b, *map), ValueError);
}

}  // namespace
}  // namespace lattice
