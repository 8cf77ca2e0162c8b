// Batch norm (+ fused ReLU) on the CPU (src/backend/cpu/batch_norm/{parallel,reference}.cpp
// through lattice::ops::batch_norm_forward / _backward): the `parallel` route equals the scalar
// `reference` route within rounding for every float dtype, train / eval, with and without ReLU
// and affine parameters, at row counts around the 32-row block size; it is bitwise the same for
// every thread count; f16 features with a large mean keep their variance (no E[x^2] - E[x]^2
// cancellation); the semantic layer's errors have lattice's "[op] argument: expected ..., got ..."
// form; N = 0 leaves the running statistics alone; the table chooses `parallel` on the CPU.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "backend/kernel_table.h"
#include "batch_norm_test_support.h"
#include "lattice/core/error.h"
#include "lattice/core/threads.h"
#include "lattice/ops/batch_norm.h"

namespace lattice {
namespace {

using bn_test::Case;
using bn_test::make;
using bn_test::run;

std::string name_of(const Case& k) {
  return std::string(to_string(k.dtype)) + " N=" + std::to_string(k.n) + " C=" + std::to_string(k.c) +
         (k.training ? " train" : " eval") + (k.relu ? " relu" : "") + (k.affine ? "" : " no-affine");
}

TEST(BatchNorm, ParallelRouteEqualsReferenceRoute) {
  for (Dtype d : {Dtype::f64, Dtype::f32, Dtype::f16, Dtype::bf16})
    for (std::int64_t n : {2, 31, 32, 33, 257, 700})
      for (std::int64_t c : {1, 3, 17, 256})
        for (int mode = 0; mode < 4; ++mode) {
          Case k;
          k.dtype = d;
          k.n = n;
          k.c = c;
          k.training = mode != 1;
          k.relu = mode >= 2;
          k.affine = mode != 3;
          k.seed = static_cast<unsigned>(n * 31 + c);
          const auto fast = run(k, RouteId::batch_norm_parallel);
          const auto ref = run(k, RouteId::batch_norm_reference);
          bn_test::expect_results_close(fast, ref, d, name_of(k));
        }
}

TEST(BatchNorm, ParallelRouteIsBitwiseTheSameForEveryThreadCount) {
  const int before = num_threads();
  for (Dtype d : {Dtype::f32, Dtype::f16}) {
    Case k;
    k.dtype = d;
    k.n = 5000;
    k.c = 19;
    k.relu = true;
    set_num_threads(1);
    const auto one = run(k, RouteId::batch_norm_parallel);
    for (int t : {2, 3, 4}) {
      set_num_threads(t);
      EXPECT_TRUE(bn_test::bitwise_equal(run(k, RouteId::batch_norm_parallel), one)) << to_string(d) << " threads=" << t;
    }
  }
  set_num_threads(before);
}

TEST(BatchNorm, LargeMeanF16KeepsTheVariance) {
  // Features around 1000 with std ~2: a one-pass E[x^2] - E[x]^2 in f32 loses ~1e-2 of the
  // variance here; the two-pass block statistics keep the reference's invstd to 1e-5.
  Case k;
  k.dtype = Dtype::f16;
  k.n = 4000;
  k.c = 4;
  k.offset = 1000.0;
  const auto fast = run(k, RouteId::batch_norm_parallel);
  const auto ref = run(k, RouteId::batch_norm_reference);
  bn_test::expect_close(fast.invstd, ref.invstd, 1e-5, "invstd");
  bn_test::expect_close(fast.mean, ref.mean, 1e-6, "mean");
  bn_test::expect_close(fast.y, ref.y, 4e-3, "y");
}

template <class E>
std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "no exception";
}

TEST(BatchNorm, ErrorsNameTheOpAndArgument) {
  const Array x1 = make(Dtype::f32, {1.0, 2.0}, {1, 2});
  const Array x = make(Dtype::f32, std::vector<double>(8, 1.0), {4, 2});
  const Array v2 = make(Dtype::f32, {0.0, 1.0}, {2});
  ops::BatchNormOptions o;
  o.op = "BatchNorm";
  EXPECT_EQ(message_of<ValueError>([&] { ops::batch_norm_forward(x1, {}, {}, v2, v2.clone(), o); }),
            "[BatchNorm] input: expected more than 1 row per channel when training, got 1");
  EXPECT_EQ(message_of<TypeError>([&] { ops::batch_norm_forward(x, make(Dtype::f64, {1.0, 1.0}, {2}), {}, {}, {}, o); }),
            "[BatchNorm] weight: expected float32 (per-channel values of float32 features), got float64");
  EXPECT_EQ(message_of<ValueError>([&] { ops::batch_norm_forward(Array{}, {}, {}, {}, {}, o); }),
            "[BatchNorm] input: expected an (N, C) feature matrix, got nothing");
  const Array strided = make(Dtype::f32, {0.0, 0.0, 0.0, 0.0}, {4}).strided_view({2}, {2});
  EXPECT_EQ(message_of<ValueError>([&] { ops::batch_norm_forward(x, {}, {}, strided, v2.clone(), o); }),
            "[BatchNorm] running_mean: expected a contiguous tensor (it is updated in place), got a strided one");
  EXPECT_EQ(message_of<ValueError>([&] { ops::batch_norm_forward(x, {}, {}, v2.clone(), {}, o); }),
            "[BatchNorm] running_var: expected both running statistics or neither, got only one");
  EXPECT_NE(message_of<ValueError>([&] {
              ops::batch_norm_forward(x, make(Dtype::f32, {1.0, 1.0, 1.0}, {3}), {}, {}, {}, o);
            }).find("[BatchNorm] weight: expected shape (C=2,), got (3,)"),
            std::string::npos);
  EXPECT_NE(message_of<ValueError>([&] { ops::batch_norm_forward(make(Dtype::f32, {1.0, 2.0}, {2}), {}, {}, {}, {}, o); })
                .find("[BatchNorm] input: expected a 2-D (N, C) feature matrix"),
            std::string::npos);
  EXPECT_NE(message_of<TypeError>([&] {
              ops::batch_norm_forward(Array::from_vector<std::int32_t>({1, 2, 3, 4}, {2, 2}), {}, {}, {}, {}, o);
            }).find("[BatchNorm] input: expected float16, bfloat16, float32 or float64 features, got int32"),
            std::string::npos);
  o.training = false;
  EXPECT_EQ(message_of<ValueError>([&] { ops::batch_norm_forward(x, {}, {}, {}, {}, o); }),
            "[BatchNorm] running_mean: expected running statistics in eval mode (training=False), got nothing");
  o.training = true;
  o.momentum = 1.5;
  EXPECT_NE(message_of<ValueError>([&] { ops::batch_norm_forward(x, {}, {}, {}, {}, o); })
                .find("[BatchNorm] momentum: expected a value in [0, 1]"),
            std::string::npos);
}

TEST(BatchNorm, BackwardErrorsNameTheOpAndArgument) {
  const Array x = make(Dtype::f32, std::vector<double>(8, 1.0), {4, 2});
  const Array v2 = make(Dtype::f32, {0.0, 1.0}, {2});
  ops::BatchNormOptions o;
  o.op = "BatchNorm";
  o.relu = true;
  const auto f = ops::batch_norm_forward(make(Dtype::f32, {1, 2, 3, 4, 5, 6, 7, 8}, {4, 2}), {}, {}, {}, {}, o);
  auto bwd = [&](const Array& dy, const Array& y, const Array& mean) {
    return [&, dy, y, mean] { ops::batch_norm_backward(dy, x, y, {}, mean, f.invstd, true, true, o); };
  };
  const Array dy = make(Dtype::f32, std::vector<double>(8, 1.0), {4, 2});
  EXPECT_EQ(message_of<TypeError>(bwd(make(Dtype::f16, std::vector<double>(8, 1.0), {4, 2}), f.y, f.mean)),
            "[BatchNorm] grad_out: expected float32 (the dtype of the input), got float16");
  EXPECT_EQ(message_of<ValueError>(bwd(make(Dtype::f32, std::vector<double>(6, 1.0), {3, 2}), f.y, f.mean)),
            "[BatchNorm] grad_out: expected shape (4, 2) (that of the input), got (3, 2)");
  EXPECT_EQ(message_of<ValueError>(bwd(dy, Array{}, f.mean)),
            "[BatchNorm] output: expected the forward's output (relu=True), got nothing");
  EXPECT_EQ(message_of<ValueError>(bwd(dy, make(Dtype::f32, std::vector<double>(6, 1.0), {3, 2}), f.mean)),
            "[BatchNorm] output: expected the forward's output: float32 (4, 2) on cpu, got float32 (3, 2) on cpu");
  EXPECT_EQ(message_of<ValueError>(bwd(dy, f.y, Array{})),
            "[BatchNorm] mean: expected the forward's saved statistics, got nothing");
  EXPECT_EQ(message_of<ValueError>(bwd(dy, f.y, v2.reshape({1, 2}))),
            "[BatchNorm] mean: expected shape (C=2,), got (1, 2)");
  // nothing requested: nothing computed, nothing allocated
  const auto none = ops::batch_norm_backward(dy, x, f.y, {}, f.mean, f.invstd, false, false, o);
  EXPECT_FALSE(none.dx.defined() || none.dweight.defined() || none.dbias.defined());
}

TEST(BatchNorm, NoRowsInTrainingLeaveTheRunningStatistics) {
  for (RouteId r : {RouteId::batch_norm_parallel, RouteId::batch_norm_reference}) {
    const Array x = Array::empty({0, 3}, Dtype::f32);
    Array rm = make(Dtype::f32, {2.0, 2.0, 2.0}, {3});
    Array rv = make(Dtype::f32, {3.0, 3.0, 3.0}, {3});
    ops::BatchNormOptions o;
    o.policy.force = r;
    const auto f = ops::batch_norm_forward(x, make(Dtype::f32, {1.0, 1.0, 1.0}, {3}), {}, rm, rv, o);
    EXPECT_EQ(f.y.dim(0), 0);
    EXPECT_EQ(bn_test::values(rm), (std::vector<double>{2.0, 2.0, 2.0}));
    EXPECT_EQ(bn_test::values(rv), (std::vector<double>{3.0, 3.0, 3.0}));
    const auto g = ops::batch_norm_backward(Array::empty({0, 3}, Dtype::f32), x, f.y,
                                            make(Dtype::f32, {1.0, 1.0, 1.0}, {3}), f.mean, f.invstd, true, true, o);
    EXPECT_EQ(bn_test::values(g.dweight), (std::vector<double>{0.0, 0.0, 0.0}));
    EXPECT_EQ(bn_test::values(g.dbias), (std::vector<double>{0.0, 0.0, 0.0}));
  }
}

TEST(BatchNorm, TableChoosesParallelOnTheCpuAndListsEveryRoute) {
  const Array x = make(Dtype::f16, std::vector<double>(8, 1.0), {4, 2});
  ops::BatchNormOptions o;
  const Explanation e = ops::explain_batch_norm(x, BatchNormPass::backward, o);
  ASSERT_TRUE(e.chosen.has_value());
  EXPECT_EQ(*e.chosen, RouteId::batch_norm_parallel);
  EXPECT_EQ(e.rows.size(), 3u);
  ASSERT_NE(e.row(RouteId::batch_norm_cuda), nullptr);
  EXPECT_FALSE(e.row(RouteId::batch_norm_cuda)->verdict.admitted);
  EXPECT_NE(e.to_string().find("batch_norm backward (training): float16 on cpu, N=4 C=2"), std::string::npos)
      << e.to_string();
  for (RouteId r : {RouteId::batch_norm_parallel, RouteId::batch_norm_reference})
    EXPECT_NE(backend::find_batch_norm_kernels(r), nullptr);
}

}  // namespace
}  // namespace lattice
