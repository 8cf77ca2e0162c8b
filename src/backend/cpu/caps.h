// CPU capabilities (threads, vector ISA, BLAS) for DeviceCaps.
#pragma once

#include "lattice/core/caps.h"

namespace lattice::backend::cpu {

CpuCaps query_cpu_caps();

}  // namespace lattice::backend::cpu
