// Pooling routes: the route table (input-exclusive admission follows the window geometry,
// select() == explain().chosen), and the CPU kernels on hand-built edge lists: the reference
// against hand-computed numbers (ties, NaN, empty rows), csr_reduce and input_exclusive equal to
// the reference bitwise on random edge lists for every dtype and mode.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backend/args.h"
#include "backend/kernel_table.h"
#include "lattice/core/dtype.h"
#include "lattice/core/error.h"
#include "lattice/core/threads.h"
#include "lattice/route/route.h"

namespace lattice {
namespace {

// A CPU pooling route's entry points as its kernel file registered them (LATTICE_ROUTE_KERNELS),
// read through the kernel table the semantic layer calls.
const backend::PoolKernels& pool_route(RouteId id) {
  const backend::PoolKernels* k = backend::find_pool_kernels(id);
  if (k == nullptr) throw InternalError("no kernels registered for pool route " + std::string(to_string(id)));
  return *k;
}

DeviceCaps cpu_caps() {
  DeviceCaps caps;
  caps.cpu.threads = 4;
  caps.cpu.blas = "blis";
  caps.cuda.built = false;
  return caps;
}

PoolProblem local(Int3 size, Int3 stride, Int3 dilation = {1, 1, 1}) {
  PoolProblem p;
  p.op = "max_pool3d";
  p.pass = PoolPass::input_grad;
  p.device = Device::cpu();
  p.n_in = 100;
  p.n_out = 40;
  p.channels = 8;
  p.n_edges = 100;
  p.spec.size = size;
  p.spec.stride = stride;
  p.spec.dilation = dilation;
  return p;
}

TEST(RoutePool, InputExclusiveNeedsDisjointWindowsOnEveryAxis) {
  EXPECT_EQ(explain(local({2, 2, 2}, {2, 2, 2}), cpu_caps()).chosen, RouteId::pool_input_exclusive);
  EXPECT_EQ(explain(local({3, 3, 3}, {3, 3, 3}), cpu_caps()).chosen, RouteId::pool_input_exclusive);
  EXPECT_EQ(explain(local({1, 1, 1}, {1, 1, 1}), cpu_caps()).chosen, RouteId::pool_input_exclusive);
  EXPECT_EQ(explain(local({2, 2, 2}, {3, 3, 3}, {2, 2, 2}), cpu_caps()).chosen,
            RouteId::pool_input_exclusive);
  const Explanation e = explain(local({2, 2, 3}, {2, 2, 2}), cpu_caps());
  EXPECT_EQ(e.chosen, RouteId::pool_csr_reduce);
  EXPECT_EQ(e.row(RouteId::pool_input_exclusive)->verdict.reason,
            "windows overlap on axis z: stride 2 < (size-1)*dilation+1 = 3");
  EXPECT_EQ(explain(local({2, 2, 2}, {2, 2, 2}, {1, 2, 1}), cpu_caps()).chosen,
            RouteId::pool_csr_reduce);
}

TEST(RoutePool, EdgeSourcesDecideExclusivity) {
  PoolProblem p = local({2, 2, 2}, {2, 2, 2});
  p.edges = PoolEdges::batch;
  p.spec = KernelSpec{};
  EXPECT_EQ(explain(p, cpu_caps()).chosen, RouteId::pool_input_exclusive);
  for (PoolEdges e : {PoolEdges::transposed, PoolEdges::transposed_target, PoolEdges::trilinear}) {
    p.edges = e;
    EXPECT_EQ(explain(p, cpu_caps()).chosen, RouteId::pool_csr_reduce) << to_string(e);
  }
  p.edges = PoolEdges::target;
  p.spec.size = {2, 2, 2};
  p.spec.stride = {2, 2, 2};
  EXPECT_EQ(explain(p, cpu_caps()).chosen, RouteId::pool_input_exclusive);
}

TEST(RoutePool, SelectEqualsExplainChosenOnAGridOfProblems) {
  int cases = 0;
  for (Device device : {Device::cpu(), Device::cuda(0)})
    for (Dtype dtype : {Dtype::f16, Dtype::bf16, Dtype::f32, Dtype::f64, Dtype::i32})
      for (PoolPass pass : {PoolPass::forward, PoolPass::input_grad})
        for (PoolEdges edges :
             {PoolEdges::forward, PoolEdges::batch, PoolEdges::transposed, PoolEdges::trilinear})
          for (std::optional<RouteId> force :
               {std::optional<RouteId>{}, std::optional<RouteId>{RouteId::pool_reference},
                std::optional<RouteId>{RouteId::pool_input_exclusive},
                std::optional<RouteId>{RouteId::conv_reference}}) {
            PoolProblem p = local({2, 2, 2}, {2, 2, 2});
            p.device = device;
            p.dtype = dtype;
            p.pass = pass;
            p.edges = edges;
            const RoutePolicy policy{.force = force};
            const Explanation e = explain(p, cpu_caps(), policy);
            ASSERT_EQ(select(p, cpu_caps(), policy), e.chosen) << e.to_string();
            if (e.chosen) ASSERT_TRUE(e.row(*e.chosen)->verdict.admitted) << e.to_string();
            const bool usable = device.is_cpu() && dtype != Dtype::i32;
            if (!force) ASSERT_EQ(e.chosen.has_value(), usable) << e.to_string();
            ++cases;
          }
  EXPECT_EQ(cases, 2 * 5 * 2 * 4 * 4);
}

TEST(RoutePool, ProblemSummaryNamesOpModeEdgesAndSizes) {
  const std::string s = to_string(local({3, 3, 3}, {2, 2, 2}));
  EXPECT_NE(
      s.find("max_pool3d input_grad (max): forward edges (kernel (3, 3, 3) stride (2, 2, 2))"),
      std::string::npos)
      << s;
  EXPECT_NE(s.find("N_in=100 N_out=40 C=8 edges=100"), std::string::npos) << s;
}

// ---- kernels ------------------------------------------------------------------------------------

struct Edges {
  std::int64_t n_in = 0;
  std::vector<std::int64_t> out_ptr{0};
  std::vector<std::int32_t> in_idx;
  std::vector<double> weights;
  void row(std::vector<std::int32_t> inputs, std::vector<double> w = {}) {
    for (auto i : inputs) in_idx.push_back(i);
    for (auto v : w) weights.push_back(v);
    out_ptr.push_back(static_cast<std::int64_t>(in_idx.size()));
  }
  backend::PoolArgs args(PoolMode mode, std::int64_t c, Dtype dtype = Dtype::f64) const {
    backend::PoolArgs a;
    a.dtype = dtype;
    a.mode = mode;
    a.n_in = n_in;
    a.n_out = static_cast<std::int64_t>(out_ptr.size()) - 1;
    a.channels = c;
    a.n_edges = static_cast<std::int64_t>(in_idx.size());
    a.out_ptr = out_ptr.data();
    a.in_idx = in_idx.data();
    a.weights = weights.empty() ? nullptr : weights.data();
    return a;
  }
};

TEST(PoolReference, HandComputedModesTiesNanAndEmptyRows) {
  // Rows: o0 <- {2, 0, 1} (listed in kernel order, not input order), o1 <- {}, o2 <- {3}.
  Edges g;
  g.n_in = 4;
  g.row({2, 0, 1}, {0.5, 0.25, 0.25});
  g.row({});
  g.row({3}, {1.0});
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> x{5, 1, 5, 2, 5, nan, 9, 4};  // (4, 2)
  std::vector<double> y(6);
  std::vector<std::int32_t> am(6);
  auto a = g.args(PoolMode::max, 2);
  a.x = x.data();
  a.y = y.data();
  a.argmax = am.data();
  pool_route(RouteId::pool_reference).forward(a);
  // channel 0: values 5 (row 2), 5 (row 0), 5 (row 1): tie -> row 0; channel 1: NaN (row 2) wins.
  EXPECT_EQ(am, (std::vector<std::int32_t>{0, 2, -1, -1, 3, 3}));
  EXPECT_EQ(y[0], 5.0);
  EXPECT_TRUE(std::isnan(y[1]));
  EXPECT_EQ(y[2], 0.0);
  EXPECT_EQ(y[4], 9.0);
  const std::vector<double> dy{1, 2, 3, 4, 5, 6};
  std::vector<double> dx(8);
  a.dy = dy.data();
  a.dx = dx.data();
  pool_route(RouteId::pool_reference).input_grad(a);
  EXPECT_EQ(dx, (std::vector<double>{1, 0, 0, 0, 0, 2, 5, 6}));

  auto s = g.args(PoolMode::avg, 2);
  const std::vector<double> xs{1, 2, 3, 4, 5, 6, 7, 8};
  s.x = xs.data();
  s.y = y.data();
  pool_route(RouteId::pool_reference).forward(s);
  EXPECT_EQ(y, (std::vector<double>{3, 4, 0, 0, 7, 8}));
  auto w = g.args(PoolMode::weighted, 2);
  w.x = xs.data();
  w.y = y.data();
  pool_route(RouteId::pool_reference).forward(w);
  EXPECT_EQ(y, (std::vector<double>{0.25 * 1 + 0.25 * 3 + 0.5 * 5, 0.25 * 2 + 0.25 * 4 + 0.5 * 6, 0,
                                    0, 7, 8}));
}

template <class T>
std::vector<T> random_values(std::int64_t n, std::mt19937& gen, bool ties) {
  std::normal_distribution<float> d;
  std::vector<T> v(static_cast<std::size_t>(n));
  for (auto& e : v) e = store<T>(static_cast<Accum<T>>(ties ? std::round(d(gen)) : d(gen)));
  return v;
}

// Random edge list: each output row takes a random subset of inputs; `exclusive` gives every
// input at most one output.
Edges random_edges(std::int64_t n_in, std::int64_t n_out, bool exclusive, std::mt19937& gen) {
  Edges g;
  g.n_in = n_in;
  std::vector<std::int32_t> owner(static_cast<std::size_t>(n_in));
  for (auto& o : owner)
    o = static_cast<std::int32_t>(gen() % static_cast<std::uint32_t>(n_out + 1)) - 1;
  for (std::int64_t o = 0; o < n_out; ++o) {
    std::vector<std::int32_t> rows;
    std::vector<double> w;
    for (std::int32_t i = 0; i < n_in; ++i) {
      const bool take = exclusive ? owner[i] == o : gen() % 13 == 0;
      if (take) {
        rows.push_back(i);
        w.push_back(std::uniform_real_distribution<double>(0.1, 1.0)(gen));
      }
    }
    std::shuffle(rows.begin(), rows.end(), gen);  // edge order within a row is not input order
    g.row(rows, w);
  }
  return g;
}

template <class T>
void check_routes_equal(Dtype dtype) {
  std::mt19937 gen(11);
  const std::int64_t n_in = 700, n_out = 300, c = 400;  // above the parallel threshold
  for (bool exclusive : {false, true})
    for (PoolMode mode : {PoolMode::sum, PoolMode::avg, PoolMode::max, PoolMode::weighted}) {
      const Edges g = random_edges(n_in, n_out, exclusive, gen);
      const auto x = random_values<T>(n_in * c, gen, mode == PoolMode::max);
      const auto dy = random_values<T>(n_out * c, gen, false);
      std::vector<T> y_ref(n_out * c), y(n_out * c), dx_ref(n_in * c), dx(n_in * c);
      std::vector<std::int32_t> am_ref(n_out * c), am(n_out * c);
      auto a = g.args(mode, c, dtype);
      a.x = x.data();
      a.dy = dy.data();
      a.y = y_ref.data();
      a.argmax = am_ref.data();
      pool_route(RouteId::pool_reference).forward(a);
      a.dx = dx_ref.data();
      pool_route(RouteId::pool_reference).input_grad(a);
      for (int threads : {1, 3}) {
        set_num_threads(threads);
        a.y = y.data();
        a.argmax = am.data();
        pool_route(RouteId::pool_csr_reduce).forward(a);
        EXPECT_EQ(std::memcmp(y.data(), y_ref.data(), y.size() * sizeof(T)), 0) << to_string(mode);
        EXPECT_EQ(am, am_ref) << to_string(mode);
        a.argmax = am_ref.data();
        a.dx = dx.data();
        pool_route(RouteId::pool_csr_reduce).input_grad(a);
        EXPECT_EQ(std::memcmp(dx.data(), dx_ref.data(), dx.size() * sizeof(T)), 0)
            << to_string(mode);
        if (exclusive) {
          std::fill(dx.begin(), dx.end(), T{});
          pool_route(RouteId::pool_input_exclusive).input_grad(a);
          EXPECT_EQ(std::memcmp(dx.data(), dx_ref.data(), dx.size() * sizeof(T)), 0)
              << to_string(mode);
        }
      }
    }
}

TEST(PoolRoutes, CsrReduceAndInputExclusiveEqualReferenceBitwise) {
  const int before = num_threads();
  check_routes_equal<double>(Dtype::f64);
  check_routes_equal<float>(Dtype::f32);
  check_routes_equal<Half>(Dtype::f16);
  check_routes_equal<BFloat16>(Dtype::bf16);
  set_num_threads(before);
}

}  // namespace
}  // namespace lattice
