// The route-table engine shared by every op family's table file (src/route/<family>_routes.cpp).
// Private to src/route.
#pragma once

#include <algorithm>
#include <array>
#include <string>

#include "lattice/route/route.h"

namespace lattice::route_detail {

template <class Problem>
struct RouteSpec {
  RouteId id;
  int rank;  // lower is preferred
  Verdict (*admit)(const Problem&, const DeviceCaps&);
};

inline Verdict needs_cpu(const Device& device) {
  if (!device.is_cpu()) return Verdict::no("runs on cpu; the data is on " + to_string(device));
  return Verdict::ok();
}

// A CUDA device with at least `tier` in this build (caps.cuda reports why not otherwise).
inline Verdict needs_cuda(const Device& device, const DeviceCaps& caps, GpuTier tier = GpuTier::classic) {
  if (!device.is_cuda()) return Verdict::no("runs on cuda; the data is on " + to_string(device));
  if (!caps.cuda.built) return Verdict::no("needs the CUDA backend; " + caps.cuda.status);
  if (caps.cuda.device_count == 0) return Verdict::no("needs a CUDA device; " + caps.cuda.status);
  if (static_cast<int>(caps.cuda.tier) < static_cast<int>(tier))
    return Verdict::no("needs GPU tier " + std::string(to_string(tier)) + " or above, device has " +
                       std::string(to_string(caps.cuda.tier)) + " (sm_" + std::to_string(caps.cuda.sm) + ")");
  return Verdict::ok();
}

inline Verdict needs_float(Dtype dtype) {
  if (!is_floating(dtype))
    return Verdict::no("needs a float dtype, got " + std::string(to_string(dtype)));
  return Verdict::ok();
}

template <class Problem, std::size_t N>
Explanation run_table(const std::array<RouteSpec<Problem>, N>& table, const Problem& problem,
                      const DeviceCaps& caps, const RoutePolicy& policy) {
  Explanation e;
  e.op = problem.op;
  e.problem = to_string(problem);
  e.caps = to_string(caps);
  e.forced = policy.force;
  for (const auto& spec : table) e.rows.push_back({spec.id, spec.rank, spec.admit(problem, caps)});
  std::stable_sort(e.rows.begin(), e.rows.end(),
                   [](const RouteRow& a, const RouteRow& b) { return a.rank < b.rank; });
  if (policy.force) {
    const RouteRow* forced = e.row(*policy.force);
    if (!forced) {
      e.forced_reason = "route '" + std::string(op_family(*policy.force)) + ":" +
                        std::string(to_string(*policy.force)) + "' is not a route of " + e.op;
    } else if (!forced->verdict.admitted) {
      e.forced_reason = forced->verdict.reason;
    } else {
      e.chosen = forced->id;
    }
    return e;
  }
  for (const auto& row : e.rows) {
    if (row.verdict.admitted) {
      e.chosen = row.id;
      break;
    }
  }
  return e;
}


}  // namespace lattice::route_detail
