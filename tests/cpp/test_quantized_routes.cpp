// Specification tests of the "quantized" route table (packed int4/int8 weights, issue 7):
// fused_dequant_gemm preferred on CPU with a BLAS for f32/f16/bf16 activations, dequant_reference
// for every float dtype on CPU; both rejected off the CPU in a build without CUDA; on a CUDA
// device cuda_dequant_gemm preferred (any tier), dequant_reference admitted for f32/f16/bf16;
// route names and families.
#include <gtest/gtest.h>

#include <string>

#include "lattice/core/device.h"
#include "lattice/core/dtype.h"
#include "lattice/route/caps.h"
#include "lattice/route/problem.h"
#include "lattice/route/route.h"

namespace lattice {
namespace {

DeviceCaps caps_with(std::string blas) {
  DeviceCaps caps;
  caps.cpu = CpuCaps{.threads = 2, .isa = "avx2", .blas = std::move(blas)};
  caps.cuda.built = false;
  caps.cuda.status = "built without CUDA";
  return caps;
}

QuantizedProblem problem(Dtype dtype) {
  QuantizedProblem p;
  p.op = "subm_conv3d";
  p.has_relation = true;
  p.relation = RelationKind::submanifold;
  p.dtype = dtype;
  p.bits = 4;
  p.group_size = 64;
  p.n_in = p.n_out = 100;
  p.c_in = 64;
  p.c_out = 32;
  p.kernel_volume = 27;
  p.n_edges = 700;
  return p;
}

TEST(QuantizedRoutes, FusedPreferredForF32F16BF16) {
  for (Dtype d : {Dtype::f32, Dtype::f16, Dtype::bf16}) {
    const Explanation e = explain(problem(d), caps_with("blis-serial"));
    ASSERT_TRUE(e.chosen);
    EXPECT_EQ(*e.chosen, RouteId::quantized_fused_dequant_gemm);
    ASSERT_EQ(e.rows.size(), 4u);
    EXPECT_TRUE(e.row(RouteId::quantized_dequant_reference)->verdict.admitted);
    EXPECT_FALSE(e.row(RouteId::quantized_cuda_dequant_gemm)->verdict.admitted);  // CPU data
    EXPECT_FALSE(e.row(RouteId::quantized_cuda_decode_conv)->verdict.admitted);
  }
}

TEST(QuantizedRoutes, F64AndNoBlasFallBackToDequantReference) {
  const Explanation e64 = explain(problem(Dtype::f64), caps_with("blis-serial"));
  EXPECT_EQ(*e64.chosen, RouteId::quantized_dequant_reference);
  EXPECT_NE(e64.row(RouteId::quantized_fused_dequant_gemm)->verdict.reason.find("float64"), std::string::npos);
  const Explanation nb = explain(problem(Dtype::f32), caps_with(""));
  EXPECT_EQ(*nb.chosen, RouteId::quantized_dequant_reference);
}

TEST(QuantizedRoutes, CudaDataAdmitsNoRouteAndForcedRouteIsReported) {
  QuantizedProblem p = problem(Dtype::f16);
  p.device = Device::cuda(0);
  const Explanation e = explain(p, caps_with("blis-serial"));
  EXPECT_FALSE(e.chosen);
  EXPECT_NE(e.to_string().find("runs on cpu"), std::string::npos);
  RoutePolicy force;
  force.force = RouteId::quantized_dequant_reference;
  EXPECT_EQ(*explain(problem(Dtype::f32), caps_with("blis-serial"), force).chosen,
            RouteId::quantized_dequant_reference);
  force.force = RouteId::conv_reference;  // not a route of this table
  const Explanation bad = explain(problem(Dtype::f32), caps_with("blis-serial"), force);
  EXPECT_FALSE(bad.chosen);
  EXPECT_NE(bad.forced_reason.find("is not a route of subm_conv3d"), std::string::npos);
}

TEST(QuantizedRoutes, CudaDeviceChoosesCudaDequantGemm) {
  DeviceCaps caps = caps_with("blis-serial");
  caps.cuda.built = true;
  caps.cuda.status = "ok";
  caps.cuda.device_count = 1;
  caps.cuda.sm = 75;
  caps.cuda.tier = GpuTier::classic;
  for (Dtype d : {Dtype::f32, Dtype::f16, Dtype::bf16}) {
    QuantizedProblem p = problem(d);
    p.device = Device::cuda(0);
    const Explanation e = explain(p, caps);
    ASSERT_TRUE(e.chosen);
    EXPECT_EQ(*e.chosen, RouteId::quantized_cuda_decode_conv);  // the tensor-core default (issue 19)
    EXPECT_EQ(e.rows.front().id, RouteId::quantized_cuda_decode_conv);
    EXPECT_TRUE(e.row(RouteId::quantized_cuda_dequant_gemm)->verdict.admitted);
    EXPECT_TRUE(e.row(RouteId::quantized_dequant_reference)->verdict.admitted);
    EXPECT_NE(e.row(RouteId::quantized_fused_dequant_gemm)->verdict.reason.find("runs on cpu"), std::string::npos);
  }
  QuantizedProblem p64 = problem(Dtype::f64);
  p64.device = Device::cuda(0);
  const Explanation e64 = explain(p64, caps);
  EXPECT_FALSE(e64.chosen);
  EXPECT_NE(e64.row(RouteId::quantized_cuda_dequant_gemm)->verdict.reason.find("float64"), std::string::npos);
  EXPECT_NE(e64.row(RouteId::quantized_cuda_decode_conv)->verdict.reason.find("float64"), std::string::npos);
  // CPU data never runs the CUDA route
  const Explanation cpu = explain(problem(Dtype::f32), caps);
  EXPECT_EQ(*cpu.chosen, RouteId::quantized_fused_dequant_gemm);
  EXPECT_NE(cpu.row(RouteId::quantized_cuda_dequant_gemm)->verdict.reason.find("runs on cuda"), std::string::npos);
}

TEST(QuantizedRoutes, NamesAndFamily) {
  EXPECT_EQ(to_string(RouteId::quantized_cuda_dequant_gemm), "cuda_dequant_gemm");
  EXPECT_EQ(op_family(RouteId::quantized_cuda_dequant_gemm), "quantized");
  EXPECT_EQ(route_from_string("quantized", "cuda_dequant_gemm"), RouteId::quantized_cuda_dequant_gemm);
  EXPECT_EQ(to_string(RouteId::quantized_fused_dequant_gemm), "fused_dequant_gemm");
  EXPECT_EQ(to_string(RouteId::quantized_dequant_reference), "dequant_reference");
  EXPECT_EQ(op_family(RouteId::quantized_fused_dequant_gemm), "quantized");
  EXPECT_EQ(route_from_string("quantized", "dequant_reference"), RouteId::quantized_dequant_reference);
  EXPECT_FALSE(route_from_string("conv", "fused_dequant_gemm"));
  EXPECT_NE(to_string(problem(Dtype::f32)).find("int4 weight (group 64"), std::string::npos);
}

}  // namespace
}  // namespace lattice
