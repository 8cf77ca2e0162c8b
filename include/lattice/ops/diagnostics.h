// Public diagnostics: what was built and which devices are usable.
#pragma once

#include <string>

#include "lattice/route/caps.h"

namespace lattice {

// Device capabilities as seen by the route layer.
DeviceCaps device_caps();
// Multi-line summary: version, build flags, CPU caps, CUDA status/tier.
std::string backend_info();

}  // namespace lattice
