// CPU quantize routes, one file each.
#pragma once

#include "backend/args.h"

namespace lattice::backend::cpu {

QuantizeResult quantize_reference(const QuantizeArgs& args);

}  // namespace lattice::backend::cpu
