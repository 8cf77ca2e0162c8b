// Shared by the CUDA GoogleTest files: the device the tests run on and the one skip rule (a test
// that needs a GPU skips with a printed reason when the build has no CUDA backend or the machine
// no device, so the CPU-only CI stays green and says why).
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "backend/kernel_table.h"
#include "lattice/core/device.h"

namespace lattice::cuda_test {

inline const Device kGpu = Device::cuda(0);

// Why CUDA tests cannot run here, or empty when cuda:0 is usable.
inline std::string cuda_unavailable() {
  const CudaCaps caps = backend::device_caps().cuda;
  if (!caps.built) return "lattice was built without CUDA (" + caps.status + ")";
  if (caps.device_count < 1) return "no CUDA device (" + caps.status + ")";
  return {};
}

}  // namespace lattice::cuda_test

// Skips the current test (printing the reason) unless `why_expr` is empty.
#define LATTICE_SKIP_IF(why_expr)                                  \
  do {                                                             \
    const std::string lattice_why_ = (why_expr);                   \
    if (!lattice_why_.empty()) {                                   \
      std::printf("[  SKIPPED ] %s\n", lattice_why_.c_str());      \
      GTEST_SKIP() << "CUDA test skipped: " << lattice_why_;       \
    }                                                              \
  } while (0)

#define LATTICE_REQUIRE_CUDA() LATTICE_SKIP_IF(::lattice::cuda_test::cuda_unavailable())
