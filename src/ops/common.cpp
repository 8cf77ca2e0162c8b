#include "ops/common.h"

#include <cstdlib>
#include <string>

#include "lattice/core/error.h"

namespace lattice::ops {

RoutePolicy effective_policy(const RoutePolicy& policy, std::string_view family) {
  if (policy.force) return policy;
  const char* env = std::getenv("LATTICE_FORCE_ROUTE");
  if (!env || !*env) return policy;
  std::string_view spec(env);
  if (auto colon = spec.find(':'); colon != std::string_view::npos) {
    if (spec.substr(0, colon) != family) return policy;
    spec = spec.substr(colon + 1);
  }
  auto id = route_from_string(family, spec);
  if (!id) {
    // A route name of another family (no prefix given) leaves this family alone.
    for (std::string_view other : {"conv", "quantize"})
      if (other != family && route_from_string(other, spec)) return policy;
    std::string got = "'";
    got.append(env).append("'");
    throw_value_error("LATTICE_FORCE_ROUTE", "route", "a route name of " + std::string(family), got);
  }
  RoutePolicy p = policy;
  p.force = id;
  return p;
}

RouteId chosen_or_throw(const Explanation& e) {
  if (e.chosen) return *e.chosen;
  if (e.forced)
    throw_value_error(e.op, "route", "an admitted route",
                      "'" + std::string(to_string(*e.forced)) + "' (rejected: " + e.forced_reason + ")");
  throw UnsupportedError("[" + e.op + "] no route admitted this problem\n" + e.to_string());
}

}  // namespace lattice::ops
