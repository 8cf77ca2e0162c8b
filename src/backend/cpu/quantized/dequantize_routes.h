// The dequantize route of cpu weights (decode.cpp): the packed-weight decoder entry point.
// Plain C++ declarations; admission is decided in src/route/dequantize_routes.cpp.
#pragma once

#include "backend/args.h"

namespace lattice::backend::cpu {

void dequantize_reference(const DequantizeArgs& args);

}  // namespace lattice::backend::cpu
