// The coordinate-utility route table (downsample_coords, morton_codes, morton_order, prune, crop,
// sparse_collate, dense, from_dense). The row's admit() matches the Constraints comment of
// src/backend/cpu/coords/reference.cpp.
#include "route/route_table.h"

namespace lattice {

namespace {

using route_detail::needs_cpu;
using route_detail::RouteSpec;

// Every pass, any N (shapes, ranges and grids are checked by the semantic layer), CPU only.
Verdict admit_coords_reference(const CoordsProblem& p, const DeviceCaps&) {
  return needs_cpu(p.device);
}

constexpr std::array<RouteSpec<CoordsProblem>, 1> kCoordsRoutes{{
    {RouteId::coords_reference, 9, admit_coords_reference},
}};

}  // namespace

Explanation explain(const CoordsProblem& problem, const DeviceCaps& caps,
                    const RoutePolicy& policy) {
  return route_detail::run_table(kCoordsRoutes, problem, caps, policy);
}

}  // namespace lattice
