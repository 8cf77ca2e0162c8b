#include "lattice/ops/diagnostics.h"

#include "backend/kernel_table.h"
#include "lattice/core/threads.h"

#ifndef LATTICE_VERSION
#define LATTICE_VERSION "unknown"
#endif

namespace lattice {

DeviceCaps device_caps() { return backend::device_caps(); }

std::string backend_info() {
  const DeviceCaps caps = device_caps();
  std::string s = "lattice " LATTICE_VERSION "\n";
  s += "  build: C++20, CUDA backend ";
  s += LATTICE_BUILD_CUDA ? "compiled" : "not compiled";
  s += "\n  cpu: " + std::to_string(num_threads()) + " threads, ISA " + caps.cpu.isa + ", BLAS " +
       (caps.cpu.blas.empty() ? std::string("none") : caps.cpu.blas) + "\n";
  s += "  cuda: ";
  if (!caps.cuda.built) {
    s += "built without CUDA";
  } else if (caps.cuda.device_count == 0) {
    s += caps.cuda.status;
  } else {
    s += caps.cuda.name + ", sm_" + std::to_string(caps.cuda.sm) + ", tier " +
         std::string(to_string(caps.cuda.tier)) + ", " + std::to_string(caps.cuda.sm_count) + " SMs, " +
         std::to_string(caps.cuda.shared_memory_per_block / 1024) + " KiB shared memory per block, " +
         std::to_string(caps.cuda.device_count) + " device(s)";
  }
  return s + "\n";
}

}  // namespace lattice
