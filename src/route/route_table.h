// The route-table engine shared by every op family's table file (src/route/<family>_routes.cpp).
// Private to src/route.
#pragma once

#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <vector>

#include "lattice/route/route.h"

namespace lattice::route_detail {

// A family's table row: the route's declaration (RouteInfo: everything names, parsing, docs and
// tests read) next to its admit() predicate.
template <class Problem>
struct RouteSpec {
  RouteInfo info;
  Verdict (*admit)(const Problem&, const DeviceCaps&);
};

// Appends a family table's declarations to `out` (route_table() collects every family this way).
template <class Problem, std::size_t N>
void append_infos(std::vector<RouteInfo>& out, const std::array<RouteSpec<Problem>, N>& table) {
  for (const auto& spec : table) out.push_back(spec.info);
}

// Each family's table file defines one of these (route.cpp lists them, in table order).
void conv_route_infos(std::vector<RouteInfo>& out);
void quantize_route_infos(std::vector<RouteInfo>& out);
void point_voxel_route_infos(std::vector<RouteInfo>& out);
void pool_route_infos(std::vector<RouteInfo>& out);
void algebra_route_infos(std::vector<RouteInfo>& out);
void coords_route_infos(std::vector<RouteInfo>& out);
void quantized_route_infos(std::vector<RouteInfo>& out);
void relation_route_infos(std::vector<RouteInfo>& out);
void pool_edges_route_infos(std::vector<RouteInfo>& out);
void point_index_route_infos(std::vector<RouteInfo>& out);
void dequantize_route_infos(std::vector<RouteInfo>& out);
void batch_norm_route_infos(std::vector<RouteInfo>& out);

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
  for (const auto& spec : table) e.rows.push_back({spec.info.id, spec.info.rank, spec.admit(problem, caps)});
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

// run_table(...).chosen without building the explanation: the forced route when it is a row of
// this table and admitted, otherwise the first admitted row in rank order (stable, as run_table).
template <class Problem, std::size_t N>
std::optional<RouteId> decide_table(const std::array<RouteSpec<Problem>, N>& table, const Problem& problem,
                                    const DeviceCaps& caps, const RoutePolicy& policy) {
  if (policy.force) {
    for (const auto& spec : table)
      if (spec.info.id == *policy.force)
        return spec.admit(problem, caps).admitted ? std::optional<RouteId>(spec.info.id) : std::nullopt;
    return std::nullopt;
  }
  std::array<std::size_t, N> order{};  // rank order, stable (N is a handful of rows)
  for (std::size_t i = 0; i < N; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&table](std::size_t a, std::size_t b) { return table[a].info.rank < table[b].info.rank; });
  for (std::size_t i : order)
    if (table[i].admit(problem, caps).admitted) return table[i].info.id;
  return std::nullopt;
}

}  // namespace lattice::route_detail
