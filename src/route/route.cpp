// Route vocabulary and the rendering of explanations. Each op family's table lives in its own
// file (conv_routes.cpp, quantize_routes.cpp, ...); select() == explain().chosen by construction.
#include "lattice/route/route.h"

#include <cstdio>

namespace lattice {

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

}  // namespace lattice
