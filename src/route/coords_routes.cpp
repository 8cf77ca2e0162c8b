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
    {{.id = RouteId::coords_cuda,
      .family = "coords",
      .name = "cuda",
      .device = "cuda",
      .tier = GpuTier::classic,
      .rank = 0,
      .kernels = "cuda::coords_cuda_downsample cuda::coords_cuda_morton cuda::coords_cuda_select cuda::coords_cuda_collate cuda::coords_cuda_dense_index cuda::coords_cuda_nonzero",
      .files = {{{"src/backend/cuda/coords/utilities.cu",
          "CUDA (data on a cuda device, the CUDA backend built and a device present); any "
          "int32 coordinate rows (N, 4) (downsample, crop, dense) or (N, 3|4) (Morton, sparse_collate "
          "samples); downsample on fewer than 2^30 rows (the device coordinate table's limit); strides "
          ">= 1; Morton values x, y, z within [-2^20, 2^20) (checked by the semantic layer); prune masks "
          "of N bytes; dense rows inside the grid and from_dense masks of B*X*Y*Z bytes (checked by the "
          "semantic layer); any N, including none. Deterministic: bitwise-identical results run to run, "
          "equal to the CPU reference route."}}}},
     admit_coords_cuda},
    {{.id = RouteId::coords_reference,
      .family = "coords",
      .name = "reference",
      .device = "cpu",
      .tier = GpuTier::none,
      .rank = 9,
      .kernels = "cpu::coords_reference_downsample cpu::coords_reference_morton cpu::coords_reference_select cpu::coords_reference_collate cpu::coords_reference_dense_index cpu::coords_reference_nonzero",
      .files = {{{"src/backend/cpu/coords/reference.cpp",
          "CPU; any int32 coordinate rows (N, 4) (downsample, crop, dense) or (N, 3|4) "
          "(Morton, sparse_collate samples); strides >= 1; Morton values x, y, z within [-2^20, 2^20) "
          "(checked by the semantic layer); prune masks of N bytes; dense rows inside the grid and "
          "from_dense masks of B*X*Y*Z bytes (checked by the semantic layer); any N, including none. "
          "Deterministic (single-threaded, input order)."}}}},
     admit_coords_reference},
}};

}  // namespace

void route_detail::coords_route_infos(std::vector<RouteInfo>& out) { route_detail::append_infos(out, kCoordsRoutes); }

Explanation explain(const CoordsProblem& problem, const DeviceCaps& caps,
                    const RoutePolicy& policy) {
  return route_detail::run_table(kCoordsRoutes, problem, caps, policy);
}

std::optional<RouteId> select(const CoordsProblem& problem, const DeviceCaps& caps, const RoutePolicy& policy) {
  return route_detail::decide_table(kCoordsRoutes, problem, caps, policy);
}

}  // namespace lattice
