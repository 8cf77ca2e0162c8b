// Batch norm (+ fused ReLU) on a CUDA device (src/backend/cuda/batch_norm/blocked.cu): for f32,
// f16, bf16 (and f64), training and eval, with and without ReLU and affine parameters, forward
// and backward, the `cuda` route equals the CPU `parallel` route within rounding (same block
// order and arithmetic, so normally bit for bit) and the scalar `reference` route on small
// problems; row counts around the 32-row block and the 32-lane partial sums (N = 2, 31, 32, 33,
// 1025, 3000, 200003: not a multiple of any block size, and large) and C in {1, 3, 64, 96, 256};
// two runs give the same bits; N = 0 in training leaves the running statistics alone; mixed
// devices are rejected with lattice's errors; the table chooses `cuda` for cuda data.
// Skipped, with the reason printed, when no CUDA device is available.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backend/kernel_table.h"
#include "batch_norm_test_support.h"
#include "cuda_test_support.h"
#include "lattice/core/error.h"
#include "lattice/ops/batch_norm.h"

namespace lattice {
namespace {

using bn_test::Case;
using bn_test::run;
using cuda_test::kGpu;

std::string name_of(const Case& k) {
  return std::string(to_string(k.dtype)) + " N=" + std::to_string(k.n) + " C=" + std::to_string(k.c) +
         (k.training ? " train" : " eval") + (k.relu ? " relu" : "") + (k.affine ? "" : " no-affine");
}

Case make_case(Dtype d, std::int64_t n, std::int64_t c, int mode) {
  Case k;
  k.dtype = d;
  k.n = n;
  k.c = c;
  k.training = mode != 1;
  k.relu = mode >= 2;
  k.affine = mode != 3;
  k.seed = static_cast<unsigned>(n * 7 + c * 3 + mode);
  return k;
}

TEST(CudaBatchNorm, EqualsCpuRoutesAcrossDtypesModesAndShapes) {
  LATTICE_REQUIRE_CUDA();
  for (Dtype d : {Dtype::f32, Dtype::f16, Dtype::bf16, Dtype::f64})
    for (std::int64_t n : {2, 31, 32, 33, 1025, 3000})
      for (std::int64_t c : {1, 3, 64, 96, 256})
        for (int mode = 0; mode < 4; ++mode) {
          const Case k = make_case(d, n, c, mode);
          const auto gpu = run(k, RouteId::batch_norm_cuda, kGpu);
          const auto cpu = run(k, RouteId::batch_norm_parallel);
          bn_test::expect_results_close(gpu, cpu, d, "cuda vs parallel " + name_of(k));
          if (n * c <= 1025 * 64) {
            const auto ref = run(k, RouteId::batch_norm_reference);
            bn_test::expect_results_close(gpu, ref, d, "cuda vs reference " + name_of(k));
          }
        }
}

TEST(CudaBatchNorm, LargeRowCounts) {
  LATTICE_REQUIRE_CUDA();
  // 200003 rows: 6251 blocks of 32 rows, the last one of 3; grid-stride loops over more than one
  // grid for C = 256 (51M elements).
  for (Dtype d : {Dtype::f32, Dtype::f16, Dtype::bf16})
    for (std::int64_t c : {3, 64, 256})
      for (int mode : {0, 2}) {
        if (c == 256 && (d != Dtype::f16 || mode != 2)) continue;  // 51M elements: one case
        Case k = make_case(d, 200003, c, mode);
        k.offset = d == Dtype::f32 ? 100.0 : 0.0;
        const auto gpu = run(k, RouteId::batch_norm_cuda, kGpu);
        const auto cpu = run(k, RouteId::batch_norm_parallel);
        bn_test::expect_results_close(gpu, cpu, d, "cuda vs parallel " + name_of(k));
      }
}

TEST(CudaBatchNorm, TwoRunsGiveTheSameBits) {
  LATTICE_REQUIRE_CUDA();
  for (Dtype d : {Dtype::f32, Dtype::f16, Dtype::bf16}) {
    const Case k = make_case(d, 70001, 96, 2);
    EXPECT_TRUE(bn_test::bitwise_equal(run(k, RouteId::batch_norm_cuda, kGpu), run(k, RouteId::batch_norm_cuda, kGpu)))
        << to_string(d);
  }
}

TEST(CudaBatchNorm, NoRowsInTrainingLeaveTheRunningStatistics) {
  LATTICE_REQUIRE_CUDA();
  const Array x = Array::empty({0, 3}, Dtype::f16, kGpu);
  Array rm = bn_test::make(Dtype::f32, {2.0, 2.0, 2.0}, {3}, kGpu);
  Array rv = bn_test::make(Dtype::f32, {3.0, 3.0, 3.0}, {3}, kGpu);
  const Array w = bn_test::make(Dtype::f32, {1.0, 1.0, 1.0}, {3}, kGpu);
  ops::BatchNormOptions o;
  o.relu = true;
  const auto f = ops::batch_norm_forward(x, w, {}, rm, rv, o);
  EXPECT_EQ(f.y.dim(0), 0);
  EXPECT_EQ(bn_test::values(rm), (std::vector<double>{2.0, 2.0, 2.0}));
  EXPECT_EQ(bn_test::values(rv), (std::vector<double>{3.0, 3.0, 3.0}));
  const auto g = ops::batch_norm_backward(Array::empty({0, 3}, Dtype::f16, kGpu), x, f.y, w, f.mean, f.invstd, true,
                                          true, o);
  EXPECT_EQ(bn_test::values(g.dweight), (std::vector<double>{0.0, 0.0, 0.0}));
  EXPECT_EQ(bn_test::values(g.dbias), (std::vector<double>{0.0, 0.0, 0.0}));
}

TEST(CudaBatchNorm, MixedDevicesAreRejected) {
  LATTICE_REQUIRE_CUDA();
  const Array x = bn_test::make(Dtype::f32, std::vector<double>(8, 1.0), {4, 2}, kGpu);
  const Array w_cpu = bn_test::make(Dtype::f32, {1.0, 1.0}, {2});
  ops::BatchNormOptions o;
  o.op = "BatchNorm";
  try {
    ops::batch_norm_forward(x, w_cpu, {}, {}, {}, o);
    ADD_FAILURE() << "no error";
  } catch (const ValueError& e) {
    EXPECT_STREQ(e.what(), "[BatchNorm] weight: expected a tensor on cuda:0, got cpu");
  }
  const auto f = ops::batch_norm_forward(x, {}, {}, {}, {}, o);
  try {
    ops::batch_norm_backward(bn_test::make(Dtype::f32, std::vector<double>(8, 1.0), {4, 2}), x, {}, {}, f.mean,
                             f.invstd, true, true, o);
    ADD_FAILURE() << "no error";
  } catch (const ValueError& e) {
    EXPECT_STREQ(e.what(), "[BatchNorm] grad_out: expected a tensor on cuda:0, got cpu");
  }
}

TEST(CudaBatchNorm, TableChoosesCudaForCudaData) {
  LATTICE_REQUIRE_CUDA();
  const Array x = bn_test::make(Dtype::bf16, std::vector<double>(8, 1.0), {4, 2}, kGpu);
  for (BatchNormPass p : {BatchNormPass::forward, BatchNormPass::backward}) {
    const Explanation e = ops::explain_batch_norm(x, p, {});
    ASSERT_TRUE(e.chosen.has_value());
    EXPECT_EQ(*e.chosen, RouteId::batch_norm_cuda) << e.to_string();
  }
  EXPECT_NE(backend::find_batch_norm_kernels(RouteId::batch_norm_cuda), nullptr);
  // A CPU route forced on cuda data is rejected with the reason.
  ops::BatchNormOptions o;
  o.policy.force = RouteId::batch_norm_parallel;
  EXPECT_THROW(ops::batch_norm_forward(x, {}, {}, {}, {}, o), ValueError);
}

}  // namespace
}  // namespace lattice
