// The sparse-algebra route table (alignment by coordinate value, lookups, and the combine of
// aligned rows). Each row's admit() matches the Constraints comment of its kernel file under
// src/backend/<device>/algebra/.
#include "route/route_table.h"

namespace lattice {

namespace {

using route_detail::needs_cpu;
using route_detail::needs_float;
using route_detail::RouteSpec;

bool is_combine(AlgebraPass pass) {
  return pass == AlgebraPass::forward || pass == AlgebraPass::backward;
}

// The hashed route probes the coordinate index the semantic layer always builds for the sets it
// aligns (building it is also how duplicate rows are caught), so it needs nothing more.
Verdict admit_algebra_hashed(const AlgebraProblem& p, const DeviceCaps&) {
  if (auto v = needs_cpu(p.device); !v.admitted) return v;
  if (is_combine(p.pass)) return needs_float(p.dtype);
  return Verdict::ok();
}

Verdict admit_algebra_reference(const AlgebraProblem& p, const DeviceCaps&) {
  if (auto v = needs_cpu(p.device); !v.admitted) return v;
  if (is_combine(p.pass)) return needs_float(p.dtype);
  return Verdict::ok();
}

// The CUDA route hashes the sets itself on the device (and checks them for repeated rows); its
// device table holds fewer than 2^30 rows: both sets of an alignment, the table of a lookup.
Verdict admit_algebra_cuda_hashed(const AlgebraProblem& p, const DeviceCaps& caps) {
  if (auto v = route_detail::needs_cuda(p.device, caps); !v.admitted) return v;
  if (is_combine(p.pass)) return needs_float(p.dtype);
  constexpr std::int64_t kMaxTableRows = std::int64_t{1} << 30;
  if (p.n_lhs >= kMaxTableRows || (p.pass == AlgebraPass::align && p.n_rhs >= kMaxTableRows))
    return Verdict::no("hashes fewer than 2^30 rows per set on the device");
  return Verdict::ok();
}

constexpr std::array<RouteSpec<AlgebraProblem>, 3> kAlgebraRoutes{{
    {RouteId::algebra_hashed, 0, admit_algebra_hashed},
    {RouteId::algebra_cuda_hashed, 0, admit_algebra_cuda_hashed},
    {RouteId::algebra_reference, 9, admit_algebra_reference},
}};

}  // namespace

Explanation explain(const AlgebraProblem& problem, const DeviceCaps& caps,
                    const RoutePolicy& policy) {
  return route_detail::run_table(kAlgebraRoutes, problem, caps, policy);
}

}  // namespace lattice
