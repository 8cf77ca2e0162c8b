// Host+device shared kernel geometry: the one home of offsets, the output-coordinate rules and
// floor division (DESIGN.md layout). Everything is computed in int64 so that derived
// coordinates can be range-checked before they are narrowed to int32.
#pragma once

#include <cstdint>

#include "lattice/core/vocab.h"

#if defined(__CUDACC__)
#define LATTICE_HD __host__ __device__ inline
#else
#define LATTICE_HD inline
#endif

namespace lattice::geometry {

constexpr std::int64_t kInt32Min = -2147483648LL;
constexpr std::int64_t kInt32Max = 2147483647LL;

LATTICE_HD bool fits_int32(std::int64_t v) { return v >= kInt32Min && v <= kInt32Max; }

// Python-style floor division (rounds toward -inf); b > 0.
LATTICE_HD std::int64_t floor_div(std::int64_t a, std::int64_t b) {
  std::int64_t q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}

// Kernel row -> per-axis index; rows are enumerated x-major, z fastest:
// row = (x*Ky + y)*Kz + z.
LATTICE_HD void kernel_index(std::int64_t row, const Int3& size, std::int64_t idx[3]) {
  idx[2] = row % size[2];
  idx[1] = (row / size[2]) % size[1];
  idx[0] = row / (static_cast<std::int64_t>(size[2]) * size[1]);
}

// Offset of kernel row `row` (SEMANTICS.md): centered relations use (idx - size/2)*dilation for
// odd sizes and idx*dilation for even sizes; transposed/generative use idx*dilation.
LATTICE_HD void kernel_offset(std::int64_t row, const KernelSpec& spec, bool centered,
                              std::int64_t off[3]) {
  std::int64_t idx[3];
  kernel_index(row, spec.size, idx);
  for (int a = 0; a < 3; ++a) {
    std::int64_t base = (centered && (spec.size[a] % 2 == 1)) ? idx[a] - spec.size[a] / 2 : idx[a];
    off[a] = base * spec.dilation[a];
  }
}

}  // namespace lattice::geometry
