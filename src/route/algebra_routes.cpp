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

constexpr std::array<RouteSpec<AlgebraProblem>, 2> kAlgebraRoutes{{
    {RouteId::algebra_hashed, 0, admit_algebra_hashed},
    {RouteId::algebra_reference, 9, admit_algebra_reference},
}};

}  // namespace

Explanation explain(const AlgebraProblem& problem, const DeviceCaps& caps,
                    const RoutePolicy& policy) {
  return route_detail::run_table(kAlgebraRoutes, problem, caps, policy);
}

}  // namespace lattice
