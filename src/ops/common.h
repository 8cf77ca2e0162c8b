// Helpers shared by the semantic-layer op files.
#pragma once

#include <string_view>

#include "lattice/route/route.h"

namespace lattice::ops {

// The caller's policy, or the one named by the environment variable LATTICE_FORCE_ROUTE
// ("<family>:<route>" or "<route>", e.g. "conv:reference"; for benchmarks) when the caller forced
// nothing. An unknown name in the variable raises ValueError.
RoutePolicy effective_policy(const RoutePolicy& policy, std::string_view family);

// The chosen route, or: ValueError "[op] route: expected an admitted route, got 'x' (rejected:
// reason)" for a rejected forced route; UnsupportedError with the explain table when no route
// is admitted.
RouteId chosen_or_throw(const Explanation& explanation);

}  // namespace lattice::ops
