// Device load/store between lattice's storage types (Half, BFloat16, float, double) and their
// accumulation type, bit-for-bit the conversions of lattice/core/dtype.h and src/core/dtype.cpp
// (round to nearest even, NaN kept as the same quiet NaN pattern, overflow to inf), so a CUDA
// route that does the same arithmetic as a CPU route produces identical bits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "lattice/core/dtype.h"

namespace lattice::backend::cuda {

__device__ inline float dev_load(Half h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h.bits & 0x8000u) << 16;
  const std::uint32_t exp = (h.bits >> 10) & 0x1fu;
  std::uint32_t mant = h.bits & 0x3ffu;
  std::uint32_t out;
  if (exp == 0) {
    if (mant == 0) {
      out = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      out = sign | static_cast<std::uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 0x1f) {
    out = sign | 0x7f800000u | (mant << 13);
  } else {
    out = sign | (exp + 127 - 15) << 23 | (mant << 13);
  }
  return __uint_as_float(out);
}
__device__ inline float dev_load(BFloat16 b) { return __uint_as_float(static_cast<std::uint32_t>(b.bits) << 16); }
__device__ inline float dev_load(float v) { return v; }
__device__ inline double dev_load(double v) { return v; }

template <class T>
__device__ inline T dev_store(Accum<T> v) {
  return static_cast<T>(v);
}
template <>
__device__ inline Half dev_store<Half>(float f) {
  const std::uint32_t u = __float_as_uint(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return Half{static_cast<std::uint16_t>(sign | 0x7e00u)};   // NaN
  if (abs >= 0x47800000u) return Half{static_cast<std::uint16_t>(sign | 0x7c00u)};  // inf
  if (abs < 0x38800000u) {  // subnormal or zero: scale into units of 2^-24, round to nearest even
    const float scaled = __fmul_rn(__uint_as_float(abs), 16777216.0f);
    const auto q = static_cast<std::uint32_t>(rintf(scaled));
    return Half{static_cast<std::uint16_t>(sign | q)};
  }
  std::uint32_t v = abs - ((127u - 15u) << 23);
  v += 0xfffu + ((v >> 13) & 1u);
  return Half{static_cast<std::uint16_t>(sign | (v >> 13))};
}
template <>
__device__ inline BFloat16 dev_store<BFloat16>(float f) {
  std::uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return BFloat16{static_cast<std::uint16_t>((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return BFloat16{static_cast<std::uint16_t>(u >> 16)};
}

}  // namespace lattice::backend::cuda
