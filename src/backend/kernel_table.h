// Kernel table: maps a route id to the backend functions that run it, and reports device
// capabilities. The semantic layer includes only this header (and args.h) from backend/.
#pragma once

#include <cstdint>

#include "backend/args.h"
#include "lattice/core/array.h"
#include "lattice/route/caps.h"
#include "lattice/route/route.h"

namespace lattice::backend {

using ConvFn = void (*)(const ConvArgs&);
struct ConvKernels {
  ConvFn forward = nullptr;
  ConvFn input_grad = nullptr;
  ConvFn weight_grad = nullptr;
};
// nullptr when the route has no kernels in this build.
const ConvKernels* find_conv_kernels(RouteId id);

using QuantizeFn = QuantizeResult (*)(const QuantizeArgs&);
QuantizeFn find_quantize_kernel(RouteId id);

// Capabilities of this process's devices: queried once and cached, except the CPU thread
// count, which is lattice's current setting (core/threads.h).
DeviceCaps device_caps();

}  // namespace lattice::backend
