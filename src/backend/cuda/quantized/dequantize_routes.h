// The dequantize route of cuda weights (decode.cpp): the packed-weight decoder entry point.
// Plain C++ declarations; admission is decided in src/route/dequantize_routes.cpp.
#pragma once

#include "backend/args.h"

namespace lattice::backend::cuda {

void dequantize_cuda(const DequantizeArgs& args);

}  // namespace lattice::backend::cuda
