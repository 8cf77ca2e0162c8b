// What a device can do, as reported by the backends and read by route admission. Vocabulary of
// the core (the backends fill it, the route layer reads it); lattice/route/caps.h forwards here.
// A build without CUDA reports it here ("built without CUDA"); it never throws.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace lattice {

// CUDA capability tiers (DESIGN.md): classic = any supported GPU (SIMT kernels);
// tensor_core = sm80+ (mma.sync fp16/bf16/tf32, cp.async); hopper = sm90 (wgmma, TMA).
enum class GpuTier { none, classic, tensor_core, hopper };
std::string_view to_string(GpuTier tier);
// sm version (e.g. 86, 90) -> tier.
GpuTier tier_for_sm(int sm);

struct CpuCaps {
  int threads = 1;        // OpenMP threads available to CPU routes
  std::string isa;        // best vector ISA compiled for and present: "avx512f", "avx2", "avx+fma", "sse4.2", "generic"
  std::string blas;       // BLAS vendor linked for gather_gemm_scatter, empty if none
};

struct CudaCaps {
  bool built = false;        // CUDA backend compiled into this build
  int device_count = 0;      // visible devices (0 when not built or no driver)
  int sm = 0;                // compute capability of the queried device, e.g. 90
  GpuTier tier = GpuTier::none;
  std::int64_t shared_memory_per_block = 0;  // opt-in maximum, bytes
  int sm_count = 0;
  std::string name;          // device name
  std::string status;        // "built without CUDA", "no CUDA device: <reason>", or "ok"
};

struct DeviceCaps {
  CpuCaps cpu;
  CudaCaps cuda;
};

// One line per device, for backend_info() and explain().
std::string to_string(const DeviceCaps& caps);

}  // namespace lattice
