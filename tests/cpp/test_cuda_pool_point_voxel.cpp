// CUDA routes of pooling (cuda_csr_reduce), point <-> voxel (cuda) and sparse_quantize (cuda)
// against the CPU routes on random inputs: coordinates and points are made on the CPU and copied
// with Array::to(Device::cuda(0)); every op then runs once on each device and the results are
// compared (max, gathers, quantization and maps bitwise; sums within SEMANTICS.md tolerances,
// though the CUDA routes keep the CPU summation order), and every CUDA result is checked bitwise
// equal across two runs. The route-table tests run everywhere; the device tests skip with the
// reason when this build or machine has no CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "backend/kernel_table.h"
#include "cuda_test_support.h"
#include "lattice/lattice.h"

namespace lattice {
namespace {

using cuda_test::kGpu;


Array host(const Array& a) { return a.device().is_cpu() ? a : a.to(Device::cpu()); }

// Element e of a float array as double.
double at(const Array& a, std::int64_t e) {
  switch (a.dtype()) {
    case Dtype::f16: return to_float(a.data<Half>()[e]);
    case Dtype::bf16: return to_float(a.data<BFloat16>()[e]);
    case Dtype::f32: return a.data<float>()[e];
    case Dtype::f64: return a.data<double>()[e];
    default: ADD_FAILURE() << "not a float array"; return 0;
  }
}

::testing::AssertionResult bitwise_equal(const Array& x, const Array& y) {
  const Array a = host(x), b = host(y);
  if (!a.defined() || !b.defined()) return ::testing::AssertionFailure() << "undefined array";
  if (a.dtype() != b.dtype() || a.shape() != b.shape())
    return ::testing::AssertionFailure() << "dtype/shape differ: " << to_string(a.dtype()) << " vs "
                                         << to_string(b.dtype()) << ", " << a.numel() << " vs " << b.numel();
  if (a.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) != 0)
    return ::testing::AssertionFailure() << "contents differ";
  return ::testing::AssertionSuccess();
}

// |a - b| <= atol + rtol * |b| elementwise (NaN matches NaN).
::testing::AssertionResult close(const Array& x, const Array& y, double rtol, double atol) {
  const Array a = host(x), b = host(y);
  if (a.dtype() != b.dtype() || a.shape() != b.shape())
    return ::testing::AssertionFailure() << "dtype/shape differ";
  for (std::int64_t e = 0; e < a.numel(); ++e) {
    const double u = at(a, e), v = at(b, e);
    if (std::isnan(u) && std::isnan(v)) continue;
    if (!(std::fabs(u - v) <= atol + rtol * std::fabs(v)))
      return ::testing::AssertionFailure() << "element " << e << ": " << u << " vs " << v;
  }
  return ::testing::AssertionSuccess();
}

// Tolerances of a dtype's sums (SEMANTICS.md: f32 accumulation, one rounding to storage).
std::pair<double, double> tol(Dtype d) {
  switch (d) {
    case Dtype::f16: return {2e-3, 2e-3};
    case Dtype::bf16: return {1.6e-2, 1.6e-2};
    case Dtype::f32: return {1e-5, 1e-6};
    default: return {1e-12, 1e-14};
  }
}

Array random_feats(std::int64_t n, std::int64_t c, Dtype dtype, std::mt19937& gen) {
  std::uniform_real_distribution<float> u(-2, 2);
  Array a = Array::empty({n, c}, dtype);
  for (std::int64_t e = 0; e < n * c; ++e) {
    // A few repeated values so that max sees ties.
    const float v = (e % 7 == 0) ? 1.0f : u(gen);
    switch (dtype) {
      case Dtype::f16: a.data<Half>()[e] = to_half(v); break;
      case Dtype::bf16: a.data<BFloat16>()[e] = to_bfloat16(v); break;
      case Dtype::f32: a.data<float>()[e] = v; break;
      default: a.data<double>()[e] = v; break;
    }
  }
  return a;
}

// n unique random coordinates in `batches` batches (including negative x, y, z).
Array random_coords(std::int64_t n, int batches, int extent, std::mt19937& gen) {
  std::uniform_int_distribution<int> b(0, batches - 1), x(-extent, extent);
  std::set<std::tuple<int, int, int, int>> seen;
  std::vector<std::int32_t> rows;
  while (static_cast<std::int64_t>(seen.size()) < n) {
    const auto t = std::make_tuple(b(gen), x(gen), x(gen), x(gen));
    if (!seen.insert(t).second) continue;
    rows.insert(rows.end(), {std::get<0>(t), std::get<1>(t), std::get<2>(t), std::get<3>(t)});
  }
  return Array::from_vector(rows, {n, 4});
}

constexpr Dtype kDtypes[] = {Dtype::f32, Dtype::f16, Dtype::bf16};

// ---- route tables (no device needed) ------------------------------------------------------------

DeviceCaps fake_cuda_caps() {
  DeviceCaps caps;
  caps.cpu.threads = 2;
  caps.cuda.built = true;
  caps.cuda.device_count = 1;
  caps.cuda.sm = 90;
  caps.cuda.tier = GpuTier::hopper;
  return caps;
}

TEST(CudaPoolPointVoxelRoutes, CudaDataChoosesTheCudaRoutesCpuDataNever) {
  PoolProblem pool;
  pool.op = "max_pool3d";
  pool.device = kGpu;
  pool.dtype = Dtype::bf16;
  for (auto pass : {PoolPass::forward, PoolPass::input_grad}) {
    pool.pass = pass;
    EXPECT_EQ(explain(pool, fake_cuda_caps()).chosen, RouteId::pool_cuda_csr_reduce);
  }
  pool.device = Device::cpu();
  EXPECT_NE(explain(pool, fake_cuda_caps()).chosen, RouteId::pool_cuda_csr_reduce);
  EXPECT_EQ(explain(pool, fake_cuda_caps()).row(RouteId::pool_cuda_csr_reduce)->verdict.reason,
            "runs on cuda; the data is on cpu");

  PointVoxelProblem pv;
  pv.op = "devoxelize";
  pv.device = kGpu;
  pv.dtype = Dtype::f16;
  EXPECT_EQ(explain(pv, fake_cuda_caps()).chosen, RouteId::point_voxel_cuda);
  pv.pass = PointVoxelPass::build_map;
  EXPECT_FALSE(explain(pv, fake_cuda_caps()).chosen.has_value());  // f16 points
  pv.dtype = Dtype::f64;
  EXPECT_EQ(explain(pv, fake_cuda_caps()).chosen, RouteId::point_voxel_cuda);

  QuantizeProblem q;
  q.device = kGpu;
  q.dtype = Dtype::f32;
  EXPECT_EQ(explain(q, fake_cuda_caps()).chosen, RouteId::quantize_cuda);
  q.device = Device::cpu();
  EXPECT_EQ(explain(q, fake_cuda_caps()).chosen, RouteId::quantize_reference);

  DeviceCaps none;  // a build without CUDA: the cuda row explains why
  none.cuda.built = false;
  none.cuda.status = "built without CUDA";
  q.device = kGpu;
  const Explanation e = explain(q, none);
  EXPECT_FALSE(e.chosen.has_value());
  EXPECT_EQ(e.row(RouteId::quantize_cuda)->verdict.reason, "needs the CUDA backend; built without CUDA");
}

// ---- pooling ------------------------------------------------------------------------------------

struct PoolRun {
  ops::PoolOutput out;
  Array dx;
  Array coords;
};

PoolRun run_pool(const ops::PoolPlan& plan, const Array& feats, const Array& dy) {
  PoolRun r;
  r.out = ops::pool_forward(plan, feats);
  r.dx = ops::pool_backward(plan, dy, r.out.argmax.defined() ? &r.out.argmax : nullptr);
  if (plan.output) r.coords = plan.output->coords();
  return r;
}

// Runs `make_plan` on the CPU set and the CUDA copy (both at tensor stride `stride`), compares
// forward and gradient, and checks that two CUDA runs agree bitwise.
template <class MakePlan>
void compare_pool(const Array& coords, MakePlan make_plan, PoolMode mode, std::mt19937& gen,
                  const std::string& what, Int3 stride = {1, 1, 1}) {
  const auto cpu_set = CoordinateSet::create(coords, stride);
  const auto gpu_set = CoordinateSet::create(coords.to(kGpu), stride);
  for (Dtype dtype : kDtypes) {
    SCOPED_TRACE(what + " " + std::string(to_string(dtype)));
    const ops::PoolPlan pc = make_plan(cpu_set);
    const ops::PoolPlan pg = make_plan(gpu_set);
    ASSERT_EQ(pc.n_out, pg.n_out);
    ASSERT_EQ(pc.n_edges, pg.n_edges);
    EXPECT_EQ(ops::explain_pool(pg, Array::empty({pg.n_in, 3}, dtype, kGpu)).chosen,
              RouteId::pool_cuda_csr_reduce);
    const Array x = random_feats(pc.n_in, 3, dtype, gen);
    const Array dy = random_feats(pc.n_out, 3, dtype, gen);
    const PoolRun c = run_pool(pc, x, dy);
    const PoolRun g1 = run_pool(pg, x.to(kGpu), dy.to(kGpu));
    const PoolRun g2 = run_pool(pg, x.to(kGpu), dy.to(kGpu));
    EXPECT_EQ(g1.out.out.device(), kGpu);
    EXPECT_EQ(g1.dx.device(), kGpu);
    if (c.coords.defined()) EXPECT_TRUE(bitwise_equal(c.coords, g1.coords));
    EXPECT_TRUE(bitwise_equal(g1.out.out, g2.out.out));
    EXPECT_TRUE(bitwise_equal(g1.dx, g2.dx));
    if (mode == PoolMode::max) {
      EXPECT_TRUE(bitwise_equal(c.out.out, g1.out.out));
      EXPECT_TRUE(bitwise_equal(c.out.argmax, g1.out.argmax));
      EXPECT_TRUE(close(c.dx, g1.dx, tol(dtype).first, tol(dtype).second));
    } else {
      EXPECT_TRUE(close(c.out.out, g1.out.out, tol(dtype).first, tol(dtype).second));
      EXPECT_TRUE(close(c.dx, g1.dx, tol(dtype).first, tol(dtype).second));
    }
  }
}

TEST(CudaPool, LocalPoolingMatchesTheCpuRoutes) {
  LATTICE_REQUIRE_CUDA();
  std::mt19937 gen(11);
  const Array coords = random_coords(3000, 3, 12, gen);
  for (PoolMode mode : {PoolMode::max, PoolMode::sum, PoolMode::avg}) {
    for (const auto& [size, stride] : {std::pair<int, int>{2, 2}, {3, 2}, {3, 1}}) {
      ops::PoolOptions o;
      o.kernel_size = {size, size, size};
      o.stride = {stride, stride, stride};
      compare_pool(
          coords, [&](const auto& set) { return ops::plan_pool("pool3d", mode, set, o); }, mode, gen,
          std::string(to_string(mode)) + " k" + std::to_string(size) + " s" + std::to_string(stride));
    }
  }
}

TEST(CudaPool, GlobalTransposedAndTrilinearMatchTheCpuRoutes) {
  LATTICE_REQUIRE_CUDA();
  std::mt19937 gen(12);
  const Array coords = random_coords(2000, 4, 10, gen);
  for (PoolMode mode : {PoolMode::max, PoolMode::sum, PoolMode::avg})
    compare_pool(
        coords, [&](const auto& set) { return ops::plan_global_pool("global_pool", mode, set); }, mode,
        gen, "global " + std::string(to_string(mode)));
  // Transposed pooling and trilinear upsampling by 2 go from a coarse input (tensor stride 2) to
  // stride 1: the input set carries stride 2 (output stride = input stride / 2).
  ops::PoolOptions o;
  compare_pool(
      coords, [&](const auto& set) { return ops::plan_pool_transpose("pool_transpose3d", set, o); },
      PoolMode::avg, gen, "transposed", Int3{2, 2, 2});
  compare_pool(
      coords,
      [&](const auto& set) {
        return ops::plan_trilinear_upsample("trilinear_upsample3d", set, Int3{2, 2, 2}, nullptr);
      },
      PoolMode::weighted, gen, "trilinear", Int3{2, 2, 2});
}

TEST(CudaPool, GlobalMaxOfAnEmptyBatchAndMixedDevicesRaise) {
  LATTICE_REQUIRE_CUDA();
  const Array coords = Array::from_vector(std::vector<std::int32_t>{0, 0, 0, 0, 2, 1, 1, 1}, {2, 4});
  const auto gpu_set = CoordinateSet::create(coords.to(kGpu), {1, 1, 1});
  try {
    ops::plan_global_pool("global_max_pool", PoolMode::max, gpu_set);
    ADD_FAILURE() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("no rows in batch 1 of 3"), std::string::npos) << e.what();
  }
  const ops::PoolPlan plan = ops::plan_global_pool("global_sum_pool", PoolMode::sum, gpu_set);
  EXPECT_EQ(plan.n_out, 3);
  try {
    ops::pool_forward(plan, Array::zeros({2, 1}, Dtype::f32));
    ADD_FAILURE() << "no error";
  } catch (const ValueError& e) {
    EXPECT_EQ(std::string(e.what()), "[global_sum_pool] feats: expected a tensor on cuda:0, got cpu");
  }
}

// ---- sparse_quantize ----------------------------------------------------------------------------

Array random_points(std::int64_t n, Dtype dtype, std::mt19937& gen) {
  std::uniform_real_distribution<double> u(-4, 4);
  Array a = Array::empty({n, 3}, dtype);
  for (std::int64_t e = 0; e < n * 3; ++e) {
    if (dtype == Dtype::f64)
      a.data<double>()[e] = u(gen);
    else
      a.data<float>()[e] = static_cast<float>(u(gen));
  }
  return a;
}

TEST(CudaQuantize, MatchesTheCpuRouteBitwise) {
  LATTICE_REQUIRE_CUDA();
  std::mt19937 gen(21);
  for (Dtype dtype : {Dtype::f32, Dtype::f64}) {
    SCOPED_TRACE(std::string(to_string(dtype)));
    Array pts = random_points(5000, dtype, gen);
    std::vector<std::int64_t> b(5000);
    for (std::int64_t i = 0; i < 5000; ++i) b[i] = i % 3;
    const Array batch = Array::from_vector(b);
    ops::QuantizeOptions q;
    q.voxel_size = {0.5, 0.25, 0.5};
    q.origin = {0.1, -0.2, 0.0};
    const ops::QuantizeOutput c = ops::sparse_quantize(pts, q, &batch);
    const Array batch_gpu = batch.to(kGpu);
    const ops::QuantizeOutput g = ops::sparse_quantize(pts.to(kGpu), q, &batch_gpu);
    const ops::QuantizeOutput g2 = ops::sparse_quantize(pts.to(kGpu), q, &batch_gpu);
    EXPECT_EQ(g.coords.device(), kGpu);
    EXPECT_TRUE(bitwise_equal(c.coords, g.coords));
    EXPECT_TRUE(bitwise_equal(c.inverse, g.inverse));
    EXPECT_TRUE(bitwise_equal(c.counts, g.counts));
    EXPECT_TRUE(bitwise_equal(g.coords, g2.coords));
    EXPECT_TRUE(bitwise_equal(g.inverse, g2.inverse));
    // NaN rows: an error naming the first, or dropped.
    if (dtype == Dtype::f64) {
      pts.data<double>()[3 * 17 + 1] = std::numeric_limits<double>::quiet_NaN();
      pts.data<double>()[3 * 40] = std::numeric_limits<double>::infinity();
    } else {
      pts.data<float>()[3 * 17 + 1] = std::numeric_limits<float>::quiet_NaN();
      pts.data<float>()[3 * 40] = std::numeric_limits<float>::infinity();
    }
    try {
      ops::sparse_quantize(pts.to(kGpu), q);
      ADD_FAILURE() << "no error";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("a non-finite value at row 17"), std::string::npos) << e.what();
    }
    q.drop_invalid = true;
    const ops::QuantizeOutput cd = ops::sparse_quantize(pts, q);
    const ops::QuantizeOutput gd = ops::sparse_quantize(pts.to(kGpu), q);
    EXPECT_TRUE(bitwise_equal(cd.coords, gd.coords));
    EXPECT_TRUE(bitwise_equal(cd.inverse, gd.inverse));
    EXPECT_TRUE(bitwise_equal(cd.counts, gd.counts));
    EXPECT_TRUE(bitwise_equal(cd.kept, gd.kept));
  }
  const Array bad = Array::from_vector(std::vector<std::int64_t>{0, -3});
  const Array bad_gpu = bad.to(kGpu);
  try {
    ops::sparse_quantize(random_points(2, Dtype::f32, gen).to(kGpu), {}, &bad_gpu);
    ADD_FAILURE() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("-3 at row 1"), std::string::npos) << e.what();
  }
}

// ---- voxelize / devoxelize / build_point_voxel_map ----------------------------------------------

TEST(CudaPointVoxel, VoxelizeMatchesTheCpuRoutes) {
  LATTICE_REQUIRE_CUDA();
  std::mt19937 gen(31);
  const std::int64_t n = 6000, c = 5;
  const Array pts = random_points(n, Dtype::f32, gen);
  ops::QuantizeOptions q;
  q.voxel_size = {0.3, 0.3, 0.3};
  const ops::PointGrouping gc = ops::group_points(pts, q);
  const ops::PointGrouping gg = ops::group_points(pts.to(kGpu), q);
  EXPECT_TRUE(bitwise_equal(gc.voxel_ptr, gg.voxel_ptr));
  EXPECT_TRUE(bitwise_equal(gc.point_idx, gg.point_idx));
  for (Dtype dtype : kDtypes) {
    const Array x = random_feats(n, c, dtype, gen);
    const Array dy = random_feats(gc.n_voxels(), c, dtype, gen);
    for (auto r : {PointReduction::sum, PointReduction::mean, PointReduction::max}) {
      SCOPED_TRACE(std::string(to_string(dtype)) + " " + std::string(to_string(r)));
      const auto fc = ops::voxelize_forward(gc, x, r);
      const auto fg = ops::voxelize_forward(gg, x.to(kGpu), r);
      const auto fg2 = ops::voxelize_forward(gg, x.to(kGpu), r);
      EXPECT_EQ(fg.feats.device(), kGpu);
      // Same order of terms as the CPU routes: bitwise, not just close.
      EXPECT_TRUE(bitwise_equal(fc.feats, fg.feats));
      EXPECT_TRUE(bitwise_equal(fg.feats, fg2.feats));
      if (r == PointReduction::max) EXPECT_TRUE(bitwise_equal(fc.argmax, fg.argmax));
      const Array bc = ops::voxelize_backward(gc, dy, fc.argmax, r);
      const Array bg = ops::voxelize_backward(gg, dy.to(kGpu), fg.argmax, r);
      EXPECT_TRUE(bitwise_equal(bc, bg));
    }
  }
}

TEST(CudaPointVoxel, MapAndDevoxelizeMatchTheCpuRoutes) {
  LATTICE_REQUIRE_CUDA();
  std::mt19937 gen(41);
  const std::int64_t n = 4000, c = 3;
  for (Dtype pdtype : {Dtype::f32, Dtype::f64}) {
    const Array pts = random_points(n, pdtype, gen);
    ops::QuantizeOptions q;
    q.voxel_size = {0.4, 0.4, 0.4};
    const ops::PointGrouping g = ops::group_points(pts, q);
    const Array vcoords = g.voxels->coords();
    for (auto mode : {PointVoxelMode::nearest, PointVoxelMode::trilinear}) {
      for (bool normalize : {true, false}) {
        SCOPED_TRACE(std::string(to_string(pdtype)) + " " + std::string(to_string(mode)) +
                     (normalize ? " normalized" : ""));
        ops::PointVoxelMapOptions o;
        o.voxel_size = q.voxel_size;
        o.mode = mode;
        o.normalize = normalize;
        const auto cpu_set = CoordinateSet::create(vcoords, {1, 1, 1});
        const auto gpu_set = CoordinateSet::create(vcoords.to(kGpu), {1, 1, 1});
        const auto mc = ops::build_point_voxel_map(pts, cpu_set, o);
        const auto mg = ops::build_point_voxel_map(pts.to(kGpu), gpu_set, o);
        EXPECT_TRUE(bitwise_equal(mc->indices, mg->indices));
        EXPECT_TRUE(bitwise_equal(mc->weights, mg->weights));
        EXPECT_TRUE(bitwise_equal(mc->voxel_ptr, mg->voxel_ptr));
        EXPECT_TRUE(bitwise_equal(mc->entries, mg->entries));
        for (Dtype dtype : kDtypes) {
          const Array vf = random_feats(g.n_voxels(), c, dtype, gen);
          const Array dy = random_feats(n, c, dtype, gen);
          const Array yc = ops::devoxelize_forward(*mc, cpu_set, vf);
          const Array yg = ops::devoxelize_forward(*mg, gpu_set, vf.to(kGpu));
          EXPECT_TRUE(bitwise_equal(yc, yg)) << to_string(dtype);
          EXPECT_TRUE(bitwise_equal(yg, ops::devoxelize_forward(*mg, gpu_set, vf.to(kGpu))));
          const Array dc = ops::devoxelize_backward(*mc, dy);
          const Array dg = ops::devoxelize_backward(*mg, dy.to(kGpu));
          EXPECT_TRUE(bitwise_equal(dc, dg)) << to_string(dtype);
          EXPECT_TRUE(bitwise_equal(dg, ops::devoxelize_backward(*mg, dy.to(kGpu))));
        }
      }
    }
  }
}

}  // namespace
}  // namespace lattice
