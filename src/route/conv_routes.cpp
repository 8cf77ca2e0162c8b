// The convolution route table. Each row's admit() matches the Constraints comment of its
// kernel file under src/backend/<device>/conv/.
#include "route/route_table.h"

namespace lattice {

namespace {

using route_detail::needs_cpu;
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

Verdict admit_conv_reference(const ConvProblem& p, const DeviceCaps&) {
  if (auto v = needs_cpu(p.device); !v.admitted) return v;
  return needs_float(p.dtype);
}

constexpr std::array<RouteSpec<ConvProblem>, 3> kConvRoutes{{
    {RouteId::conv_pointwise_matmul, 0, admit_conv_pointwise_matmul},
    {RouteId::conv_gather_gemm_scatter, 1, admit_conv_gather_gemm_scatter},
    {RouteId::conv_reference, 9, admit_conv_reference},
}};

}  // namespace

Explanation explain(const ConvProblem& problem, const DeviceCaps& caps, const RoutePolicy& policy) {
  return route_detail::run_table(kConvRoutes, problem, caps, policy);
}

}  // namespace lattice
