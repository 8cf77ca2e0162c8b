// The coordinate-utility route table (downsample_coords, morton_codes, morton_order, prune, crop,
// sparse_collate, dense, from_dense). Each row's admit() matches the Constraints comment of its
// kernel file (src/backend/cpu/coords/reference.cpp, src/backend/cuda/coords/utilities.cu).
#include "route/route_table.h"

namespace lattice {

namespace {

using route_detail::needs_cpu;
using route_detail::RouteSpec;

// Every pass, any N (shapes, ranges and grids are checked by the semantic layer), CPU only.
Verdict admit_coords_reference(const CoordsProblem& p, const DeviceCaps&) {
  return needs_cpu(p.device);
}

// Every pass on a CUDA device; downsampling hashes fewer than 2^30 rows (the device table).
Verdict admit_coords_cuda(const CoordsProblem& p, const DeviceCaps& caps) {
  if (auto v = route_detail::needs_cuda(p.device, caps); !v.admitted) return v;
  if (p.pass == CoordsPass::downsample && p.n_rows >= (std::int64_t{1} << 30))
    return Verdict::no("hashes fewer than 2^30 rows on the device");
  return Verdict::ok();
}

constexpr std::array<RouteSpec<CoordsProblem>, 2> kCoordsRoutes{{
    {RouteId::coords_cuda, 0, admit_coords_cuda},
    {RouteId::coords_reference, 9, admit_coords_reference},
}};

}  // namespace

Explanation explain(const CoordsProblem& problem, const DeviceCaps& caps,
                    const RoutePolicy& policy) {
  return route_detail::run_table(kCoordsRoutes, problem, caps, policy);
}

}  // namespace lattice
