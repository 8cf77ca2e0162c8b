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
    {{.id = RouteId::pool_cuda_csr_reduce,
      .family = "pool",
      .name = "cuda_csr_reduce",
      .device = "cuda",
      .tier = GpuTier::classic,
      .rank = 0,
      .kernels = "cuda::pool_csr_reduce_forward cuda::pool_csr_reduce_input_grad",
      .files = {{{"src/backend/cuda/pool/csr_reduce.cu",
          "CUDA device (needs_cuda: a CUDA build with a device); any float dtype (f16, bf16, "
          "f32, f64); any pool mode (sum, avg, max, weighted), any edge list (including none), forward "
          "and input_grad. Deterministic: no float atomics; bitwise-identical repeated runs, and the "
          "summation orders of the CPU routes (cpu/pool/pool_routes.h), so max and its gradient match "
          "them bit for bit and sums agree to rounding (f32/f64 round-to-nearest adds, no FMA)."}}}},
     admit_pool_cuda_csr_reduce},
    {{.id = RouteId::pool_input_exclusive,
      .family = "pool",
      .name = "input_exclusive",
      .device = "cpu",
      .tier = GpuTier::none,
      .rank = 0,
      .kernels = "cpu::pool_input_exclusive_input_grad",
      .files = {{{"src/backend/cpu/pool/input_exclusive.cpp",
          "CPU; any float dtype (f16, bf16, f32, f64); any pool mode; input_grad only; every "
          "input row has at most one edge. Admitted for forward / target relations whose windows are "
          "disjoint (stride >= (size-1)*dilation + 1 on every axis) and for global pooling (each row "
          "belongs to one batch). Deterministic, and equal to the reference route."}}}},
     admit_pool_input_exclusive},
    {{.id = RouteId::pool_csr_reduce,
      .family = "pool",
      .name = "csr_reduce",
      .device = "cpu",
      .tier = GpuTier::none,
      .rank = 1,
      .kernels = "cpu::pool_csr_reduce_forward cpu::pool_csr_reduce_input_grad",
      .files = {{{"src/backend/cpu/pool/csr_reduce.cpp",
          "CPU; any float dtype (f16, bf16, f32, f64); any pool mode (sum, avg, max, "
          "weighted), any edge list (including none), forward and input_grad. Deterministic: "
          "bitwise-identical results for any thread count, and equal to the reference route."}}}},
     admit_pool_csr_reduce},
    {{.id = RouteId::pool_reference,
      .family = "pool",
      .name = "reference",
      .device = "cpu",
      .tier = GpuTier::none,
      .rank = 9,
      .kernels = "cpu::pool_reference_forward cpu::pool_reference_input_grad",
      .files = {{{"src/backend/cpu/pool/reference.cpp",
          "CPU; any float dtype (f16, bf16, f32, f64); any pool mode (sum, avg, max, "
          "weighted), any edge list (including none), forward and input_grad. Deterministic "
          "(single-threaded, fixed order)."}}}},
     admit_pool_reference},
}};

}  // namespace

void route_detail::pool_route_infos(std::vector<RouteInfo>& out) { route_detail::append_infos(out, kPoolRoutes); }

Explanation explain(const PoolProblem& problem, const DeviceCaps& caps, const RoutePolicy& policy) {
  return route_detail::run_table(kPoolRoutes, problem, caps, policy);
}

std::optional<RouteId> select(const PoolProblem& problem, const DeviceCaps& caps, const RoutePolicy& policy) {
  return route_detail::decide_table(kPoolRoutes, problem, caps, policy);
}

}  // namespace lattice
