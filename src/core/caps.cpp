#include "lattice/core/caps.h"

namespace lattice {

std::string_view to_string(GpuTier tier) {
  switch (tier) {
    case GpuTier::none: return "none";
    case GpuTier::classic: return "classic";
    case GpuTier::tensor_core: return "tensor_core";
    case GpuTier::hopper: return "hopper";
  }
  return "unknown";
}

GpuTier tier_for_sm(int sm) {
  if (sm <= 0) return GpuTier::none;
  if (sm >= 90 && sm < 100) return GpuTier::hopper;  // wgmma/TMA exist on sm_90 only
  if (sm >= 80) return GpuTier::tensor_core;
  return GpuTier::classic;
}

std::string to_string(const DeviceCaps& caps) {
  std::string s = "cpu: " + std::to_string(caps.cpu.threads) + " threads, " + caps.cpu.isa + ", BLAS " +
                  (caps.cpu.blas.empty() ? std::string("none") : caps.cpu.blas);
  s += "; cuda: ";
  if (!caps.cuda.built) {
    s += "built without CUDA";
  } else if (caps.cuda.device_count == 0) {
    s += caps.cuda.status;
  } else {
    s += caps.cuda.name + " sm_" + std::to_string(caps.cuda.sm) + " tier " +
         std::string(to_string(caps.cuda.tier)) + ", " + std::to_string(caps.cuda.sm_count) + " SMs";
  }
  return s;
}

}  // namespace lattice
