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
    {{.id = RouteId::algebra_hashed,
      .family = "algebra",
      .name = "hashed",
      .device = "cpu",
      .tier = GpuTier::none,
      .rank = 0,
      .kernels = "cpu::algebra_hashed_align cpu::algebra_hashed_lookup cpu::algebra_hashed_forward cpu::algebra_hashed_backward",
      .files = {{{"src/backend/cpu/algebra/hashed.cpp",
          "CPU; align and lookup on any int32 coordinate rows (unique within each set), given "
          "the coordinate index of every set it probes (AlignArgs::lhs_index / rhs_index, "
          "LookupArgs::index); combine passes on float dtypes (f16, bf16, f32, f64); any row count, "
          "including none. Deterministic: bitwise-identical results for any thread count."}}}},
     admit_algebra_hashed},
    {{.id = RouteId::algebra_cuda_hashed,
      .family = "algebra",
      .name = "cuda_hashed",
      .device = "cuda",
      .tier = GpuTier::classic,
      .rank = 0,
      .kernels = "cuda::algebra_cuda_hashed_align cuda::algebra_cuda_hashed_lookup cuda::algebra_cuda_hashed_forward cuda::algebra_cuda_hashed_backward",
      .files = {{{"src/backend/cuda/algebra/hashed.cu",
          "CUDA (data on a cuda device, the CUDA backend built and a device present); align "
          "and lookup on any int32 coordinate rows, unique within each set (checked here on the device, "
          "raising the CPU index's ValueError), fewer than 2^30 rows in every set that is hashed (both "
          "sets of an alignment, the table of a lookup; queries any count); combine passes on float "
          "dtypes (f16, bf16, f32, f64); any row count, including none. Deterministic: bitwise-identical "
          "results run to run, equal to the CPU reference route (no float atomics)."}}}},
     admit_algebra_cuda_hashed},
    {{.id = RouteId::algebra_reference,
      .family = "algebra",
      .name = "reference",
      .device = "cpu",
      .tier = GpuTier::none,
      .rank = 9,
      .kernels = "cpu::algebra_reference_align cpu::algebra_reference_lookup cpu::algebra_reference_forward cpu::algebra_reference_backward",
      .files = {{{"src/backend/cpu/algebra/reference.cpp",
          "CPU; align and lookup on any int32 coordinate rows (unique within each set); "
          "combine passes on float dtypes (f16, bf16, f32, f64); any row count, including none. "
          "Deterministic (single-threaded, fixed order)."}}}},
     admit_algebra_reference},
}};

}  // namespace

void route_detail::algebra_route_infos(std::vector<RouteInfo>& out) { route_detail::append_infos(out, kAlgebraRoutes); }

Explanation explain(const AlgebraProblem& problem, const DeviceCaps& caps,
                    const RoutePolicy& policy) {
  return route_detail::run_table(kAlgebraRoutes, problem, caps, policy);
}

std::optional<RouteId> select(const AlgebraProblem& problem, const DeviceCaps& caps, const RoutePolicy& policy) {
  return route_detail::decide_table(kAlgebraRoutes, problem, caps, policy);
}

}  // namespace lattice
