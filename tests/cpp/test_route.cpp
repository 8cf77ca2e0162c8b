// Specification tests for route selection (src/route, include/lattice/route): the conv and
// quantize tables evaluated with hand-built DeviceCaps (so every machine runs every case,
// including simulated GPUs), forced routes, select() == explain().chosen, the rendered
// explanation, capability tiers and route names.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "lattice/core/device.h"
#include "lattice/core/dtype.h"
#include "lattice/core/vocab.h"
#include "lattice/route/caps.h"
#include "lattice/route/problem.h"
#include "lattice/route/route.h"
#include "lattice/route/tuning.h"

namespace lattice {
namespace {

constexpr RouteId kConvRoutes[] = {RouteId::conv_pointwise_matmul,
                                   RouteId::conv_gather_gemm_scatter, RouteId::conv_reference};
constexpr RouteId kAllRoutes[] = {RouteId::conv_reference, RouteId::conv_pointwise_matmul,
                                  RouteId::conv_gather_gemm_scatter, RouteId::quantize_reference};

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

DeviceCaps cpu_caps(std::string blas = "openblas") {
  DeviceCaps caps;
  caps.cpu = CpuCaps{.threads = 2, .isa = "avx2", .blas = std::move(blas)};
  caps.cuda.built = false;
  caps.cuda.status = "built without CUDA";
  return caps;
}

// A CPU machine with one simulated GPU of compute capability `sm`.
DeviceCaps gpu_caps(int sm) {
  DeviceCaps caps = cpu_caps();
  caps.cuda = CudaCaps{.built = true,
                       .device_count = 1,
                       .sm = sm,
                       .tier = tier_for_sm(sm),
                       .shared_memory_per_block = 232448,
                       .sm_count = 132,
                       .name = "Simulated GPU sm_" + std::to_string(sm),
                       .status = "ok"};
  return caps;
}

// subm_conv3d k3 on a 1000-row cloud, f32, cpu.
ConvProblem subm3() {
  return ConvProblem{.op = "subm_conv3d",
                     .relation = RelationKind::submanifold,
                     .pass = ConvPass::forward,
                     .dtype = Dtype::f32,
                     .device = Device::cpu(),
                     .n_in = 1000,
                     .n_out = 1000,
                     .c_in = 32,
                     .c_out = 64,
                     .kernel_volume = 27,
                     .n_edges = 4400};
}

// A 1x1x1 stride-1 conv: the identity relation.
ConvProblem pointwise() {
  ConvProblem p = subm3();
  p.kernel_volume = 1;
  p.n_edges = p.n_in;
  p.identity_relation = true;
  return p;
}

const RouteRow& row_of(const Explanation& e, RouteId id) {
  const RouteRow* r = e.row(id);
  EXPECT_NE(r, nullptr) << to_string(id);
  static const RouteRow missing{RouteId::conv_reference, -1, Verdict::no("missing row")};
  return r ? *r : missing;
}

// ---- the conv table -----------------------------------------------------------------------------

TEST(RouteConv, IdentityKernelOneChoosesPointwiseMatmul) {
  const Explanation e = explain(pointwise(), cpu_caps());
  ASSERT_TRUE(e.chosen.has_value());
  EXPECT_EQ(*e.chosen, RouteId::conv_pointwise_matmul);
  EXPECT_EQ(e.op, "subm_conv3d");
  for (RouteId id : kConvRoutes) EXPECT_TRUE(row_of(e, id).verdict.admitted) << to_string(id);
  EXPECT_FALSE(e.forced.has_value());
  EXPECT_TRUE(e.forced_reason.empty());
}

TEST(RouteConv, TableListsEveryConvRouteOnceInRankOrder) {
  const Explanation e = explain(subm3(), cpu_caps());
  ASSERT_EQ(e.rows.size(), 6u);  // the three CPU routes and the three CUDA routes
  EXPECT_EQ(row_of(e, RouteId::conv_cuda_gather_gemm_scatter).verdict.reason, "runs on cuda; the data is on cpu");
  EXPECT_EQ(row_of(e, RouteId::conv_implicit_gemm_sm80).verdict.reason,
            "float32 needs allow_tf32=True (tf32 tensor cores), got allow_tf32=False");
  for (std::size_t i = 1; i < e.rows.size(); ++i) EXPECT_LT(e.rows[i - 1].rank, e.rows[i].rank);
  for (RouteId id : kConvRoutes) EXPECT_EQ(op_family(row_of(e, id).id), "conv");
  EXPECT_EQ(e.row(RouteId::quantize_reference), nullptr);
  // The scalar reference is the last resort.
  EXPECT_EQ(e.rows.back().id, RouteId::conv_reference);
}

TEST(RouteConv, Kernel27ChoosesGatherGemmScatterAndSaysWhyNotPointwise) {
  const Explanation e = explain(subm3(), cpu_caps());
  ASSERT_TRUE(e.chosen.has_value());
  EXPECT_EQ(*e.chosen, RouteId::conv_gather_gemm_scatter);
  const Verdict& v = row_of(e, RouteId::conv_pointwise_matmul).verdict;
  EXPECT_FALSE(v.admitted);
  EXPECT_EQ(v.reason, "needs kernel volume 1, got 27");
  EXPECT_TRUE(row_of(e, RouteId::conv_gather_gemm_scatter).verdict.reason.empty());
  EXPECT_TRUE(row_of(e, RouteId::conv_reference).verdict.admitted);
}

TEST(RouteConv, KernelOneThatMovesRowsIsNotPointwise) {
  ConvProblem p = pointwise();
  p.op = "conv3d";
  p.relation = RelationKind::target;
  p.identity_relation = false;
  const Explanation e = explain(p, cpu_caps());
  EXPECT_EQ(e.chosen, RouteId::conv_gather_gemm_scatter);
  const std::string& reason = row_of(e, RouteId::conv_pointwise_matmul).verdict.reason;
  EXPECT_TRUE(contains(reason, "needs the identity relation")) << reason;
  EXPECT_TRUE(contains(reason, "target")) << reason;
}

TEST(RouteConv, NonFloatDtypeRejectsEveryRoute) {
  ConvProblem p = subm3();
  p.dtype = Dtype::i32;
  const Explanation e = explain(p, cpu_caps());
  EXPECT_FALSE(e.chosen.has_value());
  for (RouteId id : kConvRoutes)
    EXPECT_EQ(row_of(e, id).verdict.reason, "needs a float dtype, got int32") << to_string(id);
}

TEST(RouteConv, EveryFloatDtypeIsAdmittedOnCpu) {
  for (Dtype d : {Dtype::f16, Dtype::bf16, Dtype::f32, Dtype::f64}) {
    ConvProblem p = subm3();
    p.dtype = d;
    EXPECT_EQ(explain(p, cpu_caps()).chosen, RouteId::conv_gather_gemm_scatter) << to_string(d);
    p = pointwise();
    p.dtype = d;
    EXPECT_EQ(explain(p, cpu_caps()).chosen, RouteId::conv_pointwise_matmul) << to_string(d);
  }
}

TEST(RouteConv, WithoutBlasTheReferenceRuns) {
  const Explanation e = explain(subm3(), cpu_caps(""));
  EXPECT_EQ(e.chosen, RouteId::conv_reference);
  EXPECT_EQ(row_of(e, RouteId::conv_gather_gemm_scatter).verdict.reason,
            "needs a BLAS library; this build has none");
  // The pointwise route says why it does not apply before anything about BLAS.
  EXPECT_EQ(row_of(e, RouteId::conv_pointwise_matmul).verdict.reason,
            "needs kernel volume 1, got 27");
  EXPECT_EQ(explain(pointwise(), cpu_caps("")).chosen, RouteId::conv_pointwise_matmul);
}

TEST(RouteConv, CudaDataOnSimulatedGpusSkipsEveryCpuRouteAndEveryReasonNamesCpu) {
  for (int sm : {75, 80, 90}) {
    for (ConvProblem p : {subm3(), pointwise()}) {
      p.device = Device::cuda(0);
      const bool one_by_one = p.identity_relation;
      const Explanation e = explain(p, gpu_caps(sm));
      // f32 without allow_tf32: a cuBLAS route on every tier (implicit GEMM needs tf32 for f32);
      // the 1x1x1 identity relation is one GEMM (cuda_pointwise_matmul) on every tier and dtype.
      EXPECT_EQ(e.chosen, one_by_one ? RouteId::conv_cuda_pointwise_matmul : RouteId::conv_cuda_gather_gemm_scatter)
          << "sm " << sm;
      EXPECT_EQ(select(p, gpu_caps(sm)), e.chosen);
      ASSERT_EQ(e.rows.size(), 6u);
      EXPECT_FALSE(row_of(e, RouteId::conv_implicit_gemm_sm80).verdict.admitted);
      EXPECT_EQ(row_of(e, RouteId::conv_cuda_pointwise_matmul).verdict.admitted, one_by_one);
      if (!one_by_one)
        EXPECT_EQ(row_of(e, RouteId::conv_cuda_pointwise_matmul).verdict.reason, "needs kernel volume 1, got 27");
      p.dtype = Dtype::f16;
      EXPECT_EQ(explain(p, gpu_caps(sm)).chosen,
                one_by_one ? RouteId::conv_cuda_pointwise_matmul
                           : sm >= 80 ? RouteId::conv_implicit_gemm_sm80 : RouteId::conv_cuda_gather_gemm_scatter);
      p.dtype = Dtype::f64;
      const Explanation f64 = explain(p, gpu_caps(sm));
      EXPECT_FALSE(f64.chosen.has_value());
      EXPECT_TRUE(contains(f64.to_string(), "no route admitted")) << f64.to_string();
      for (const RouteRow& r : e.rows) {
        if (r.id == RouteId::conv_implicit_gemm_sm80 || r.id == RouteId::conv_cuda_gather_gemm_scatter ||
            r.id == RouteId::conv_cuda_pointwise_matmul)
          continue;
        EXPECT_FALSE(r.verdict.admitted) << to_string(r.id);
        EXPECT_TRUE(contains(r.verdict.reason, "cpu"))
            << to_string(r.id) << ": " << r.verdict.reason;
        EXPECT_TRUE(contains(r.verdict.reason, "cuda:0")) << r.verdict.reason;
      }
      EXPECT_TRUE(contains(e.caps, "sm_" + std::to_string(sm))) << e.caps;
    }
  }
}

TEST(RouteConv, CpuDataIgnoresTheGpu) {
  EXPECT_EQ(explain(subm3(), gpu_caps(90)).chosen, RouteId::conv_gather_gemm_scatter);
}

// ---- forced routes ------------------------------------------------------------------------------

TEST(RouteConv, ForcedAdmittedRouteIsChosen) {
  const Explanation e = explain(subm3(), cpu_caps(), RoutePolicy{.force = RouteId::conv_reference});
  EXPECT_EQ(e.chosen, RouteId::conv_reference);
  EXPECT_EQ(e.forced, RouteId::conv_reference);
  EXPECT_TRUE(e.forced_reason.empty());
  const std::string text = e.to_string();
  EXPECT_TRUE(contains(text, "forced route 'reference' (admitted)")) << text;
  EXPECT_TRUE(contains(text, "admitted, not forced")) << text;  // gather_gemm_scatter's row
}

TEST(RouteConv, ForcedRejectedRouteChoosesNothingAndSaysWhy) {
  const Explanation e =
      explain(subm3(), cpu_caps(), RoutePolicy{.force = RouteId::conv_pointwise_matmul});
  EXPECT_FALSE(e.chosen.has_value());
  EXPECT_EQ(e.forced, RouteId::conv_pointwise_matmul);
  EXPECT_EQ(e.forced_reason, "needs kernel volume 1, got 27");
  const std::string text = e.to_string();
  EXPECT_TRUE(
      contains(text, "forced route 'pointwise_matmul' (rejected: needs kernel volume 1, got 27)"))
      << text;
  EXPECT_TRUE(contains(text, "no route admitted")) << text;
}

TEST(RouteConv, ForcingARouteOfAnotherOpFamilyIsRejected) {
  const Explanation e =
      explain(subm3(), cpu_caps(), RoutePolicy{.force = RouteId::quantize_reference});
  EXPECT_FALSE(e.chosen.has_value());
  EXPECT_TRUE(contains(e.forced_reason, "is not a route of subm_conv3d")) << e.forced_reason;
}

TEST(RouteConv, ForcingTheRouteSelectWouldPickChangesNothing) {
  const Explanation plain = explain(subm3(), cpu_caps());
  const Explanation forced =
      explain(subm3(), cpu_caps(), RoutePolicy{.force = RouteId::conv_gather_gemm_scatter});
  EXPECT_EQ(plain.chosen, forced.chosen);
}

// ---- select() == explain().chosen ---------------------------------------------------------------

TEST(RouteConv, SelectEqualsExplainChosenOnAGridOfProblems) {
  int cases = 0;
  const std::vector<DeviceCaps> machines{cpu_caps(), cpu_caps(""), gpu_caps(75), gpu_caps(80),
                                         gpu_caps(90)};
  std::vector<std::optional<RouteId>> forces{std::nullopt};
  for (RouteId id : kAllRoutes) forces.push_back(id);
  for (const DeviceCaps& caps : machines)
    for (Device device : {Device::cpu(), Device::cuda(0)})
      for (Dtype dtype : {Dtype::f16, Dtype::bf16, Dtype::f32, Dtype::f64, Dtype::i32})
        for (std::int64_t k : {1, 8, 27, 125})
          for (bool identity : {false, true})
            for (ConvPass pass : {ConvPass::forward, ConvPass::input_grad, ConvPass::weight_grad})
              for (RelationKind kind : {RelationKind::submanifold, RelationKind::forward,
                                        RelationKind::transposed_target, RelationKind::generative})
                for (const auto& force : forces) {
                  ConvProblem p = subm3();
                  p.device = device;
                  p.dtype = dtype;
                  p.kernel_volume = k;
                  p.identity_relation = identity && k == 1;
                  p.pass = pass;
                  p.relation = kind;
                  p.n_out = kind == RelationKind::forward ? 400 : 1000;
                  const RoutePolicy policy{.force = force};
                  const Explanation e = explain(p, caps, policy);
                  ASSERT_EQ(select(p, caps, policy), e.chosen) << e.to_string();
                  ++cases;
                  if (e.chosen) {
                    ASSERT_TRUE(row_of(e, *e.chosen).verdict.admitted) << e.to_string();
                  }
                  if (force) {
                    ASSERT_TRUE(!e.chosen || *e.chosen == *force) << e.to_string();
                    ASSERT_EQ(e.chosen.has_value(), e.forced_reason.empty()) << e.to_string();
                    continue;
                  }
                  // Unforced: the first admitted row in rank order, and nothing admitted above it.
                  std::optional<RouteId> first;
                  for (const RouteRow& r : e.rows)
                    if (r.verdict.admitted) {
                      first = r.id;
                      break;
                    }
                  ASSERT_EQ(e.chosen, first) << e.to_string();
                  for (const RouteRow& r : e.rows)
                    ASSERT_EQ(r.verdict.admitted, r.verdict.reason.empty()) << e.to_string();
                }
  EXPECT_EQ(cases, 5 * 2 * 5 * 4 * 2 * 3 * 4 * 5);
}

// ---- measured choices (lattice/route/tuning.h) ---------------------------------------------------

struct ClearTuned {
  ClearTuned() { clear_tuned(); }
  ~ClearTuned() { clear_tuned(); }
};

TEST(RouteTuned, ARecordedAdmittedRouteDecidesItsBucketOnly) {
  const ClearTuned clean;
  const DeviceCaps caps = cpu_caps();
  const ConvProblem p = pointwise();
  ASSERT_EQ(select(p, caps), RouteId::conv_pointwise_matmul);
  set_tuned(conv_tuning_key(p, caps),
            TunedChoice{RouteId::conv_gather_gemm_scatter,
                        {{RouteId::conv_pointwise_matmul, 2.0, ""}, {RouteId::conv_gather_gemm_scatter, 1.0, ""}}});
  EXPECT_EQ(tuned_count(), 1U);
  const Explanation e = explain(p, caps);
  EXPECT_EQ(select(p, caps), e.chosen);
  EXPECT_EQ(e.chosen, RouteId::conv_gather_gemm_scatter);
  EXPECT_TRUE(e.tuned_chosen);
  const std::string text = e.to_string();
  EXPECT_TRUE(contains(text, "tuned: measured for bucket [conv forward, submanifold, float32, cpu avx2 2 threads"))
      << text;
  EXPECT_TRUE(contains(text, "'pointwise_matmul' 2.000 ms, 'gather_gemm_scatter' 1.000 ms; fastest 'gather_gemm_scatter'"))
      << text;
  EXPECT_TRUE(contains(text, "admitted, not the measured choice")) << text;
  // the same bucket: row counts round up to powers of two (1000 and 1020 -> 1024)
  ConvProblem near = p;
  near.n_in = near.n_out = 1020;
  EXPECT_EQ(conv_tuning_key(near, caps), conv_tuning_key(p, caps));
  EXPECT_EQ(select(near, caps), RouteId::conv_gather_gemm_scatter);
  // other buckets: another pass, channel count, row-count bucket or thread count
  ConvProblem other = p;
  other.pass = ConvPass::input_grad;
  EXPECT_EQ(select(other, caps), RouteId::conv_pointwise_matmul);
  other = p;
  other.c_out = 65;
  EXPECT_EQ(select(other, caps), RouteId::conv_pointwise_matmul);
  other = p;
  other.n_in = other.n_out = 1025;
  EXPECT_EQ(select(other, caps), RouteId::conv_pointwise_matmul);
  DeviceCaps more_threads = caps;
  more_threads.cpu.threads = 4;
  EXPECT_EQ(select(p, more_threads), RouteId::conv_pointwise_matmul);
  EXPECT_TRUE(explain(other, caps).tuned.empty());
  // a forced route wins; use_tuned=false decides by rank
  const RoutePolicy forced{.force = RouteId::conv_reference};
  EXPECT_EQ(select(p, caps, forced), RouteId::conv_reference);
  EXPECT_TRUE(explain(p, caps, forced).tuned.empty());
  RoutePolicy by_rank;
  by_rank.use_tuned = false;
  EXPECT_EQ(select(p, caps, by_rank), RouteId::conv_pointwise_matmul);
  EXPECT_EQ(explain(p, caps, by_rank).chosen, RouteId::conv_pointwise_matmul);
  clear_tuned();
  EXPECT_EQ(tuned_count(), 0U);
  EXPECT_EQ(select(p, caps), RouteId::conv_pointwise_matmul);
}

TEST(RouteTuned, ARecordedRouteThatIsNotAdmittedFallsBackToTheRankOrderAndSaysWhy) {
  const ClearTuned clean;
  const DeviceCaps caps = cpu_caps();
  ConvProblem p = subm3();
  p.dtype = Dtype::f16;
  set_tuned(conv_tuning_key(p, caps), TunedChoice{RouteId::conv_implicit_gemm_sm80, {{RouteId::conv_implicit_gemm_sm80, 0.1, ""}}});
  const Explanation e = explain(p, caps);
  EXPECT_EQ(select(p, caps), e.chosen);
  EXPECT_EQ(e.chosen, RouteId::conv_gather_gemm_scatter);
  EXPECT_FALSE(e.tuned_chosen);
  EXPECT_TRUE(contains(e.to_string(), "not admitted for this call (runs on cuda; the data is on cpu): the rank order decides"))
      << e.to_string();
  EXPECT_TRUE(contains(e.to_string(), "admitted, lower preference")) << e.to_string();
}

TEST(RouteTuned, FailedCandidatesAreShownAndKeysNameTheGpu) {
  const ClearTuned clean;
  const DeviceCaps caps = gpu_caps(90);
  ConvProblem p = subm3();
  p.device = Device::cuda(0);
  p.dtype = Dtype::f16;
  const std::string key = conv_tuning_key(p, caps);
  EXPECT_TRUE(contains(key, "cuda sm_90 'Simulated GPU sm_90'")) << key;
  set_tuned(key, TunedChoice{RouteId::conv_cuda_gather_gemm_scatter,
                             {{RouteId::conv_implicit_gemm_sm80, -1.0, "illegal memory access"},
                              {RouteId::conv_cuda_gather_gemm_scatter, 0.25, ""}}});
  const Explanation e = explain(p, caps);
  EXPECT_EQ(select(p, caps), e.chosen);
  EXPECT_EQ(e.chosen, RouteId::conv_cuda_gather_gemm_scatter);
  EXPECT_TRUE(contains(e.to_string(), "'implicit_gemm_sm80' failed (illegal memory access), 'cuda_gather_gemm_scatter' 0.250 ms"))
      << e.to_string();
  // another GPU model is another bucket
  DeviceCaps other = caps;
  other.cuda.name = "Other GPU";
  EXPECT_EQ(select(p, other), RouteId::conv_implicit_gemm_sm80);
}

TEST(RouteTuned, CandidatesAreTheAdmittedRowsInRankOrderWithoutTheReference) {
  RoutePolicy by_rank;
  by_rank.use_tuned = false;
  EXPECT_EQ(tuning_candidates(explain(pointwise(), cpu_caps(), by_rank)),
            (std::vector<RouteId>{RouteId::conv_pointwise_matmul, RouteId::conv_gather_gemm_scatter}));
  EXPECT_EQ(tuning_candidates(explain(subm3(), cpu_caps(), by_rank)),
            (std::vector<RouteId>{RouteId::conv_gather_gemm_scatter}));
  EXPECT_TRUE(tuning_candidates(explain(subm3(), cpu_caps(""), by_rank)).empty());  // only the reference is admitted
  ConvProblem gpu = subm3();
  gpu.device = Device::cuda(0);
  gpu.dtype = Dtype::f16;
  EXPECT_EQ(tuning_candidates(explain(gpu, gpu_caps(90), by_rank)),
            (std::vector<RouteId>{RouteId::conv_implicit_gemm_sm80, RouteId::conv_cuda_gather_gemm_scatter}));
}

TEST(RouteTuned, TheChoiceIsTheFastestSuccessfulCandidateAndATieKeepsTheBetterRank) {
  using R = RouteId;
  const auto chosen = [](std::vector<TunedTime> t) { return tuned_choice(std::move(t)); };
  EXPECT_EQ(chosen({{R::conv_pointwise_matmul, 2.0, ""}, {R::conv_gather_gemm_scatter, 1.0, ""}})->route,
            R::conv_gather_gemm_scatter);
  EXPECT_EQ(chosen({{R::conv_pointwise_matmul, 1.0, ""}, {R::conv_gather_gemm_scatter, 1.0, ""}})->route,
            R::conv_pointwise_matmul);
  const auto failed_first = chosen({{R::conv_implicit_gemm_sm80, -1.0, "boom"}, {R::conv_cuda_gather_gemm_scatter, 5.0, ""}});
  ASSERT_TRUE(failed_first.has_value());
  EXPECT_EQ(failed_first->route, R::conv_cuda_gather_gemm_scatter);
  ASSERT_EQ(failed_first->times.size(), 2U);  // every measurement is kept, the failure with its message
  EXPECT_EQ(failed_first->times[0].error, "boom");
  EXPECT_FALSE(chosen({{R::conv_implicit_gemm_sm80, -1.0, "boom"}}).has_value());
  EXPECT_FALSE(chosen({}).has_value());
}

TEST(RouteTuned, BuildIdIsStableHex) {
  const std::string id = tuning_build_id();
  EXPECT_EQ(id.size(), 16U);
  EXPECT_EQ(id.find_first_not_of("0123456789abcdef"), std::string::npos) << id;
  EXPECT_EQ(tuning_build_id(), id);
}

// ---- the rendered explanation -------------------------------------------------------------------

TEST(RouteExplanation, ToStringNamesTheChosenRouteAndEveryRejectedReason) {
  ConvProblem p = subm3();
  const DeviceCaps caps = cpu_caps("");
  const Explanation e = explain(p, caps);
  const std::string text = e.to_string();
  EXPECT_TRUE(contains(text, e.problem)) << text;
  EXPECT_TRUE(contains(text, e.caps)) << text;
  EXPECT_TRUE(contains(text, "-> reference")) << text;
  EXPECT_TRUE(contains(text, "chosen")) << text;
  for (const RouteRow& r : e.rows) {
    EXPECT_TRUE(contains(text, std::string(to_string(r.id)))) << text;
    if (!r.verdict.admitted) {
      EXPECT_TRUE(contains(text, "rejected: " + r.verdict.reason)) << text;
    }
  }
  EXPECT_FALSE(contains(text, "no route admitted")) << text;
}

TEST(RouteExplanation, AdmittedButLowerRoutesSaySo) {
  const std::string text = explain(pointwise(), cpu_caps()).to_string();
  EXPECT_TRUE(contains(text, "-> pointwise_matmul")) << text;
  EXPECT_TRUE(contains(text, "admitted, lower preference")) << text;
}

TEST(RouteExplanation, ProblemSummaryCarriesTheShapes) {
  ConvProblem p = subm3();
  p.deterministic = false;
  p.allow_tf32 = true;
  const std::string s = to_string(p);
  for (const char* part : {"subm_conv3d", "forward", "submanifold", "float32", "cpu", "N_in=1000",
                           "N_out=1000", "C_in=32", "C_out=64", "K=27", "edges=4400",
                           "4.40 per output row", "non-deterministic allowed", "tf32 allowed"})
    EXPECT_TRUE(contains(s, part)) << part << " in " << s;
  EXPECT_TRUE(contains(to_string(pointwise()), "identity relation"));
}

TEST(RouteExplanation, CapsSummaryReportsABuildWithoutCuda) {
  const std::string s = to_string(cpu_caps());
  EXPECT_TRUE(contains(s, "2 threads")) << s;
  EXPECT_TRUE(contains(s, "openblas")) << s;
  EXPECT_TRUE(contains(s, "built without CUDA")) << s;
  EXPECT_TRUE(contains(to_string(cpu_caps("")), "BLAS none"));
  EXPECT_TRUE(contains(to_string(gpu_caps(80)), "tier tensor_core")) << to_string(gpu_caps(80));
}

// ---- tiers and names ----------------------------------------------------------------------------

TEST(RouteTier, SmVersionsMapToTiers) {
  EXPECT_EQ(tier_for_sm(0), GpuTier::none);
  EXPECT_EQ(tier_for_sm(-1), GpuTier::none);
  EXPECT_EQ(tier_for_sm(70), GpuTier::classic);
  EXPECT_EQ(tier_for_sm(75), GpuTier::classic);
  EXPECT_EQ(tier_for_sm(80), GpuTier::tensor_core);
  EXPECT_EQ(tier_for_sm(86), GpuTier::tensor_core);
  EXPECT_EQ(tier_for_sm(89), GpuTier::tensor_core);
  EXPECT_EQ(tier_for_sm(90), GpuTier::hopper);
  // wgmma/TMA are sm_90 features; later architectures get the mma.sync tier.
  EXPECT_EQ(tier_for_sm(100), GpuTier::tensor_core);
  EXPECT_EQ(tier_for_sm(120), GpuTier::tensor_core);
}

TEST(RouteTier, TierNames) {
  EXPECT_EQ(to_string(GpuTier::none), "none");
  EXPECT_EQ(to_string(GpuTier::classic), "classic");
  EXPECT_EQ(to_string(GpuTier::tensor_core), "tensor_core");
  EXPECT_EQ(to_string(GpuTier::hopper), "hopper");
}

TEST(RouteNames, EveryRouteRoundTripsThroughItsPublicName) {
  for (RouteId id : kAllRoutes) {
    const auto parsed = route_from_string(op_family(id), to_string(id));
    ASSERT_TRUE(parsed.has_value()) << to_string(id);
    EXPECT_EQ(*parsed, id);
  }
  EXPECT_EQ(to_string(RouteId::conv_gather_gemm_scatter), "gather_gemm_scatter");
  EXPECT_EQ(to_string(RouteId::conv_pointwise_matmul), "pointwise_matmul");
  EXPECT_EQ(to_string(RouteId::conv_reference), "reference");
  EXPECT_EQ(to_string(RouteId::quantize_reference), "reference");
  EXPECT_EQ(op_family(RouteId::conv_reference), "conv");
  EXPECT_EQ(op_family(RouteId::quantize_reference), "quantize");
}

TEST(RouteNames, NamesResolveWithinTheirFamilyOnly) {
  EXPECT_EQ(route_from_string("conv", "reference"), RouteId::conv_reference);
  EXPECT_EQ(route_from_string("quantize", "reference"), RouteId::quantize_reference);
  EXPECT_FALSE(route_from_string("quantize", "gather_gemm_scatter").has_value());
  EXPECT_FALSE(route_from_string("conv", "implicit_gemm").has_value());
  EXPECT_FALSE(route_from_string("conv", "").has_value());
  EXPECT_EQ(route_from_string("pool", "reference"), RouteId::pool_reference);
  EXPECT_FALSE(route_from_string("pool", "gather_gemm_scatter").has_value());
  EXPECT_FALSE(route_from_string("no_such_family", "reference").has_value());
  EXPECT_FALSE(route_from_string("conv", "conv_reference").has_value());  // no op prefix
  EXPECT_FALSE(route_from_string("conv", "Reference").has_value());
}

// ---- the quantize table -------------------------------------------------------------------------

TEST(RouteQuantize, Float32And64PointsOnCpuUseTheReference) {
  for (Dtype d : {Dtype::f32, Dtype::f64}) {
    const QuantizeProblem p{.dtype = d, .device = Device::cpu(), .n_points = 123389};
    const Explanation e = explain(p, cpu_caps());
    EXPECT_EQ(e.chosen, RouteId::quantize_reference) << to_string(d);
    EXPECT_EQ(select(p, cpu_caps()), e.chosen);
    ASSERT_EQ(e.rows.size(), 2u);  // reference, and cuda (rejected: the data is on cpu)
    EXPECT_EQ(e.row(RouteId::quantize_cuda)->verdict.reason, "runs on cuda; the data is on cpu");
    EXPECT_EQ(e.op, "sparse_quantize");
    EXPECT_TRUE(contains(e.problem, "123389 points")) << e.problem;
  }
}

TEST(RouteQuantize, OtherDtypesAndDevicesAreRejectedWithReasons) {
  QuantizeProblem p{.dtype = Dtype::f16, .device = Device::cpu(), .n_points = 10};
  Explanation e = explain(p, cpu_caps());
  EXPECT_FALSE(e.chosen.has_value());
  EXPECT_EQ(row_of(e, RouteId::quantize_reference).verdict.reason,
            "needs float32 or float64 points, got float16");
  p = QuantizeProblem{.dtype = Dtype::f32, .device = Device::cuda(0), .n_points = 10};
  e = explain(p, gpu_caps(90));
  EXPECT_EQ(e.chosen, RouteId::quantize_cuda);  // src/backend/cuda/point_voxel/quantize.cu
  EXPECT_TRUE(contains(row_of(e, RouteId::quantize_reference).verdict.reason, "cpu"));
  p.dtype = Dtype::f16;
  e = explain(p, gpu_caps(90));
  EXPECT_FALSE(e.chosen.has_value());
  EXPECT_EQ(row_of(e, RouteId::quantize_cuda).verdict.reason,
            "needs float32 or float64 points, got float16");
}

TEST(RouteQuantize, ForcedRoutes) {
  const QuantizeProblem p{.dtype = Dtype::f32, .device = Device::cpu(), .n_points = 10};
  EXPECT_EQ(explain(p, cpu_caps(), RoutePolicy{.force = RouteId::quantize_reference}).chosen,
            RouteId::quantize_reference);
  const Explanation e = explain(p, cpu_caps(), RoutePolicy{.force = RouteId::conv_reference});
  EXPECT_FALSE(e.chosen.has_value());
  EXPECT_TRUE(contains(e.forced_reason, "is not a route of sparse_quantize")) << e.forced_reason;
}


// The relation family (relation_routes.cpp): the coordinate index and relation building are chosen
// by device like any route, each rejected row with its reason; explain() of a conv lists it first.
TEST(RelationRoutes, AdmitByDevice) {
  RelationProblem p;
  p.op = "subm_conv3d";
  p.relation = RelationKind::submanifold;
  p.device = Device::cpu();
  p.n_rows = 100;
  p.kernel_volume = 27;
  const Explanation cpu = explain(p, cpu_caps());
  ASSERT_TRUE(cpu.chosen.has_value());
  EXPECT_EQ(*cpu.chosen, RouteId::relation_cpu_hash);
  EXPECT_EQ(row_of(cpu, RouteId::relation_cuda_hash).verdict.reason, "runs on cuda; the data is on cpu");
  EXPECT_TRUE(contains(to_string(p), "submanifold relation, K=27, 100 input rows on cpu")) << to_string(p);

  p.device = Device::cuda(0);
  const Explanation gpu = explain(p, gpu_caps(90));
  ASSERT_TRUE(gpu.chosen.has_value());
  EXPECT_EQ(*gpu.chosen, RouteId::relation_cuda_hash);
  EXPECT_EQ(row_of(gpu, RouteId::relation_cpu_hash).verdict.reason, "runs on cpu; the data is on cuda:0");
  // CUDA data in a build without CUDA: no route, each row says why.
  const Explanation none = explain(p, cpu_caps());
  EXPECT_FALSE(none.chosen.has_value());
  EXPECT_TRUE(contains(row_of(none, RouteId::relation_cuda_hash).verdict.reason, "needs the CUDA backend"));

  p.pass = RelationPass::index;
  EXPECT_EQ(to_string(p), "subm_conv3d relation index: 100 input rows on cuda:0");
}

TEST(RelationRoutes, PriorDecisionsRenderFirst) {
  RelationProblem p;
  p.device = Device::cpu();
  Explanation conv = explain(pointwise(), cpu_caps());
  conv.prior.push_back(explain(p, cpu_caps()));
  const std::string s = conv.to_string();
  EXPECT_EQ(s.rfind("first:\n    route decision for subm_conv3d relation build", 0), 0u) << s;
  EXPECT_LT(s.find("-> cpu_hash"), s.find("route decision for " + to_string(pointwise()))) << s;
}

// The route table (route_table(), RouteInfo) is the one declaration of every route: each RouteId
// has exactly one row, names are unique within a family, and the derived helpers (names,
// families, the "expected ..." list of the bindings) read those rows.
TEST(RouteTable, EveryRouteIdHasExactlyOneRow) {
  const auto& rows = route_table();
  // RouteId values are contiguous from 0; the last one declared closes the range.
  const int n_ids = static_cast<int>(RouteId::conv_cuda_pointwise_matmul) + 1;
  EXPECT_EQ(rows.size(), static_cast<std::size_t>(n_ids));
  for (int i = 0; i < n_ids; ++i) {
    const auto id = static_cast<RouteId>(i);
    int n = 0;
    for (const auto& r : rows) n += r.id == id;
    EXPECT_EQ(n, 1) << to_string(id);
    EXPECT_EQ(route_info(id).id, id);
    EXPECT_FALSE(route_info(id).files[0].path.empty()) << to_string(id);
    EXPECT_FALSE(route_info(id).files[0].constraints.empty()) << to_string(id);
    EXPECT_FALSE(route_info(id).kernels.empty()) << to_string(id);
  }
  for (std::size_t i = 0; i < rows.size(); ++i)
    for (std::size_t j = i + 1; j < rows.size(); ++j)
      EXPECT_FALSE(rows[i].family == rows[j].family && rows[i].name == rows[j].name)
          << rows[i].family << ":" << rows[i].name << " declared twice";
}

TEST(RouteTable, FamiliesAndNamesComeFromTheRows) {
  const auto families = route_families();
  const std::vector<std::string_view> expected{"conv", "quantize", "point_voxel", "pool",
                                               "algebra", "coords", "quantized", "relation",
                                               "pool_edges", "point_index", "dequantize", "batch_norm"};
  EXPECT_EQ(families, expected);
  // Rank order within a family, CUDA routes included (the old hand-written lists omitted them).
  const std::vector<std::string_view> conv{"pointwise_matmul", "gather_gemm_scatter", "cuda_pointwise_matmul",
                                           "implicit_gemm_sm80", "cuda_gather_gemm_scatter", "reference"};
  EXPECT_EQ(route_names("conv"), conv);
  EXPECT_TRUE(route_names("no_such_family").empty());
  EXPECT_EQ(route_name_list("conv"),
            "one of 'pointwise_matmul', 'gather_gemm_scatter', 'cuda_pointwise_matmul', 'implicit_gemm_sm80', "
            "'cuda_gather_gemm_scatter', 'reference'");
  EXPECT_EQ(route_name_list("coords"), "'cuda' or 'reference'");
  EXPECT_EQ(route_name_list("no_such_family"), "");
  for (const auto& r : route_table()) {
    EXPECT_EQ(op_family(r.id), r.family);
    EXPECT_EQ(to_string(r.id), r.name);
    EXPECT_EQ(r.device == "cpu", r.tier == GpuTier::none) << r.family << ":" << r.name;
  }
}

}  // namespace
}  // namespace lattice
