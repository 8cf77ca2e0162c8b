// The pooling route table (local, global, transposed pooling and trilinear upsampling). Each
// row's admit() matches the Constraints comment of its kernel file under src/backend/cpu/pool/.
#include "route/route_table.h"

namespace lattice {

namespace {

using route_detail::needs_cpu;
using route_detail::needs_cuda;
using route_detail::needs_float;
using route_detail::RouteSpec;

// Why some input row may feed more than one output row, or empty when every input row feeds at
// most one. For the forward rule c_i == o*s + off_k - p two outputs o1 != o2 reached from one
// input would need |off_k1 - off_k2| = |o1 - o2|*s >= s, but offsets span (size-1)*dilation on
// each axis; so stride >= (size-1)*dilation + 1 on every axis makes the windows disjoint
// (whatever the padding and the offset centring). Every row belongs to exactly one batch.
std::string overlap_reason(const PoolProblem& p) {
  switch (p.edges) {
    case PoolEdges::batch:
      return {};
    case PoolEdges::forward:
    case PoolEdges::target: {
      static constexpr char kAxis[] = {'x', 'y', 'z'};
      for (int a = 0; a < 3; ++a) {
        const std::int64_t span =
            static_cast<std::int64_t>(p.spec.size[a] - 1) * p.spec.dilation[a] + 1;
        if (p.spec.stride[a] < span)
          return std::string("windows overlap on axis ") + kAxis[a] + ": stride " +
                 std::to_string(p.spec.stride[a]) +
                 " < (size-1)*dilation+1 = " + std::to_string(span);
      }
      return {};
    }
    case PoolEdges::transposed:
    case PoolEdges::transposed_target:
      return "a transposed relation sends each input row to up to K output rows";
    case PoolEdges::trilinear:
      return "a coarse row is a trilinear neighbour of several fine rows";
  }
  return "unknown edge source";
}

Verdict admit_pool_input_exclusive(const PoolProblem& p, const DeviceCaps&) {
  if (auto v = needs_cpu(p.device); !v.admitted) return v;
  if (auto v = needs_float(p.dtype); !v.admitted) return v;
  if (p.pass != PoolPass::input_grad)
    return Verdict::no(
        "runs the input gradient only (a forward row reduces its own edges in csr_reduce)");
  if (auto why = overlap_reason(p); !why.empty()) return Verdict::no(why);
  return Verdict::ok();
}

Verdict admit_pool_csr_reduce(const PoolProblem& p, const DeviceCaps&) {
  if (auto v = needs_cpu(p.device); !v.admitted) return v;
  return needs_float(p.dtype);
}

// src/backend/cuda/pool/csr_reduce.cu: every mode, edge source and pass, any float dtype.
Verdict admit_pool_cuda_csr_reduce(const PoolProblem& p, const DeviceCaps& caps) {
  if (auto v = needs_cuda(p.device, caps); !v.admitted) return v;
  return needs_float(p.dtype);
}

Verdict admit_pool_reference(const PoolProblem& p, const DeviceCaps&) {
  if (auto v = needs_cpu(p.device); !v.admitted) return v;
  return needs_float(p.dtype);
}

constexpr std::array<RouteSpec<PoolProblem>, 4> kPoolRoutes{{
    {RouteId::pool_cuda_csr_reduce, 0, admit_pool_cuda_csr_reduce},
    {RouteId::pool_input_exclusive, 0, admit_pool_input_exclusive},
    {RouteId::pool_csr_reduce, 1, admit_pool_csr_reduce},
    {RouteId::pool_reference, 9, admit_pool_reference},
}};

}  // namespace

Explanation explain(const PoolProblem& problem, const DeviceCaps& caps, const RoutePolicy& policy) {
  return route_detail::run_table(kPoolRoutes, problem, caps, policy);
}

}  // namespace lattice
