#pragma once

#include "backend/kernel_table.h"

namespace lattice::backend::cpu {

QuantizeResult quantize_reference(const QuantizeArgs& args);

}  // namespace lattice::backend::cpu
