// Route tables: one row per route with its admit() predicate and preference rank.
// select() == explain().chosen by construction (see include/lattice/route/route.h).
#include "lattice/route/route.h"

#include <algorithm>
#include <array>
#include <cstdio>

namespace lattice {

namespace {

template <class Problem>
struct RouteSpec {
  RouteId id;
  int rank;  // lower is preferred
  Verdict (*admit)(const Problem&, const DeviceCaps&);
};

Verdict needs_cpu(const Device& device) {
  if (!device.is_cpu()) return Verdict::no("runs on cpu; the data is on " + to_string(device));
  return Verdict::ok();
}

Verdict needs_float(Dtype dtype) {
  if (!is_floating(dtype))
    return Verdict::no("needs a float dtype, got " + std::string(to_string(dtype)));
  return Verdict::ok();
}

// ---- convolution -------------------------------------------------------------------------------

Verdict admit_conv_pointwise_matmul(const ConvProblem& p, const DeviceCaps&) {
  if (auto v = needs_cpu(p.device); !v.admitted) return v;
  if (auto v = needs_float(p.dtype); !v.admitted) return v;
  if (p.kernel_volume != 1)
    return Verdict::no("needs kernel volume 1, got " + std::to_string(p.kernel_volume));
  if (!p.identity_relation)
    return Verdict::no("needs the identity relation (output rows == input rows), got a " +
                       std::string(to_string(p.relation)) + " relation that moves rows");
  return Verdict::ok();
}

Verdict admit_conv_gather_gemm_scatter(const ConvProblem& p, const DeviceCaps& caps) {
  if (auto v = needs_cpu(p.device); !v.admitted) return v;
  if (auto v = needs_float(p.dtype); !v.admitted) return v;
  if (caps.cpu.blas.empty()) return Verdict::no("needs a BLAS library; this build has none");
  return Verdict::ok();
}

Verdict admit_conv_reference(const ConvProblem& p, const DeviceCaps&) {
  if (auto v = needs_cpu(p.device); !v.admitted) return v;
  return needs_float(p.dtype);
}

constexpr std::array<RouteSpec<ConvProblem>, 3> kConvRoutes{{
    {RouteId::conv_pointwise_matmul, 0, admit_conv_pointwise_matmul},
    {RouteId::conv_gather_gemm_scatter, 1, admit_conv_gather_gemm_scatter},
    {RouteId::conv_reference, 9, admit_conv_reference},
}};

// ---- quantization ------------------------------------------------------------------------------

Verdict admit_quantize_reference(const QuantizeProblem& p, const DeviceCaps&) {
  if (auto v = needs_cpu(p.device); !v.admitted) return v;
  if (p.dtype != Dtype::f32 && p.dtype != Dtype::f64)
    return Verdict::no("needs float32 or float64 points, got " + std::string(to_string(p.dtype)));
  return Verdict::ok();
}

constexpr std::array<RouteSpec<QuantizeProblem>, 1> kQuantizeRoutes{{
    {RouteId::quantize_reference, 9, admit_quantize_reference},
}};

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

}  // namespace

std::string_view to_string(RouteId id) {
  switch (id) {
    case RouteId::conv_reference: return "reference";
    case RouteId::conv_pointwise_matmul: return "pointwise_matmul";
    case RouteId::conv_gather_gemm_scatter: return "gather_gemm_scatter";
    case RouteId::quantize_reference: return "reference";
  }
  return "unknown";
}

std::string_view op_family(RouteId id) {
  switch (id) {
    case RouteId::conv_reference:
    case RouteId::conv_pointwise_matmul:
    case RouteId::conv_gather_gemm_scatter: return "conv";
    case RouteId::quantize_reference: return "quantize";
  }
  return "unknown";
}

std::optional<RouteId> route_from_string(std::string_view family, std::string_view name) {
  for (RouteId id : {RouteId::conv_reference, RouteId::conv_pointwise_matmul,
                     RouteId::conv_gather_gemm_scatter, RouteId::quantize_reference}) {
    if (op_family(id) == family && to_string(id) == name) return id;
  }
  return std::nullopt;
}

const RouteRow* Explanation::row(RouteId id) const {
  for (const auto& r : rows)
    if (r.id == id) return &r;
  return nullptr;
}

std::string Explanation::to_string() const {
  std::string s = "route decision for " + problem + "\n";
  s += "  devices: " + caps + "\n";
  if (forced) {
    s += "  policy: forced route '" + std::string(lattice::to_string(*forced)) + "'";
    s += chosen ? " (admitted)\n" : " (rejected: " + forced_reason + ")\n";
  }
  char line[96];
  std::snprintf(line, sizeof line, "     %-22s %4s  %s\n", "route", "rank", "verdict");
  s += line;
  for (const auto& r : rows) {
    const bool is_chosen = chosen && *chosen == r.id;
    std::snprintf(line, sizeof line, "  %s %-22s %4d  ", is_chosen ? "->" : "  ",
                  std::string(lattice::to_string(r.id)).c_str(), r.rank);
    s += line;
    if (is_chosen) {
      s += "chosen";
    } else if (r.verdict.admitted) {
      s += forced ? "admitted, not forced" : "admitted, lower preference";
    } else {
      s += "rejected: " + r.verdict.reason;
    }
    s += "\n";
  }
  if (!chosen) s += "  no route admitted\n";
  return s;
}

Explanation explain(const ConvProblem& problem, const DeviceCaps& caps, const RoutePolicy& policy) {
  return run_table(kConvRoutes, problem, caps, policy);
}

Explanation explain(const QuantizeProblem& problem, const DeviceCaps& caps, const RoutePolicy& policy) {
  return run_table(kQuantizeRoutes, problem, caps, policy);
}

}  // namespace lattice
