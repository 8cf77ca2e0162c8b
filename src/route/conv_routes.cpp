// The convolution route table. Each row's admit() matches the Constraints comment of its
// kernel file under src/backend/<device>/conv/.
#include "route/route_table.h"

namespace lattice {

namespace {

using route_detail::needs_cpu;
using route_detail::needs_cuda;
using route_detail::needs_float;
using route_detail::RouteSpec;

Verdict admit_conv_pointwise_matmul(const ConvProblem& p, const DeviceCaps&) {
  if (auto v = needs_cpu(p.device); !v.admitted) return v;
  if (auto v = needs_float(p.dtype); !v.admitted) return v;
  if (p.kernel_volume != 1)
    return Verdict::no("needs kernel volume 1, got " + std::to_string(p.kernel_volume));
  if (!p.identity_relation)
    return Verdict::no("needs the identity relation (output rows == input rows), got a " +
                       std::string(to_string(p.relation)) + " relation that moves rows");
  return Verdict::ok();
}

Verdict admit_conv_gather_gemm_scatter(const ConvProblem& p, const DeviceCaps& caps) {
  if (auto v = needs_cpu(p.device); !v.admitted) return v;
  if (auto v = needs_float(p.dtype); !v.admitted) return v;
  if (caps.cpu.blas.empty()) return Verdict::no("needs a BLAS library; this build has none");
  return Verdict::ok();
}

// src/backend/cuda/conv/implicit_gemm_sm80.cu
Verdict admit_conv_implicit_gemm_sm80(const ConvProblem& p, const DeviceCaps& caps) {
  if (p.dtype != Dtype::f16 && p.dtype != Dtype::bf16 && p.dtype != Dtype::f32)
    return Verdict::no("needs float16 or bfloat16 (or float32 with allow_tf32), got " +
                       std::string(to_string(p.dtype)));
  if (p.dtype == Dtype::f32 && !p.allow_tf32)
    return Verdict::no("float32 needs allow_tf32=True (tf32 tensor cores), got allow_tf32=False");
  return needs_cuda(p.device, caps, GpuTier::tensor_core);
}

// src/backend/cuda/conv/gather_gemm_scatter.cu
Verdict admit_conv_cuda_gather_gemm_scatter(const ConvProblem& p, const DeviceCaps& caps) {
  if (p.dtype != Dtype::f16 && p.dtype != Dtype::bf16 && p.dtype != Dtype::f32)
    return Verdict::no("needs float16, bfloat16 or float32 (float64 convolutions run on cpu), got " +
                       std::string(to_string(p.dtype)));
  return needs_cuda(p.device, caps);
}

Verdict admit_conv_reference(const ConvProblem& p, const DeviceCaps&) {
  if (auto v = needs_cpu(p.device); !v.admitted) return v;
  return needs_float(p.dtype);
}

constexpr std::array<RouteSpec<ConvProblem>, 5> kConvRoutes{{
    {RouteId::conv_pointwise_matmul, 0, admit_conv_pointwise_matmul},
    {RouteId::conv_gather_gemm_scatter, 1, admit_conv_gather_gemm_scatter},
    {RouteId::conv_implicit_gemm_sm80, 2, admit_conv_implicit_gemm_sm80},
    {RouteId::conv_cuda_gather_gemm_scatter, 3, admit_conv_cuda_gather_gemm_scatter},
    {RouteId::conv_reference, 9, admit_conv_reference},
}};

}  // namespace

Explanation explain(const ConvProblem& problem, const DeviceCaps& caps, const RoutePolicy& policy) {
  return route_detail::run_table(kConvRoutes, problem, caps, policy);
}

}  // namespace lattice
