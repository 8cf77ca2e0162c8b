#include "lattice/core/dtype.h"

#include <cmath>
#include <cstring>
#include <string>

#include "lattice/core/error.h"

namespace lattice {

std::string_view to_string(Dtype dtype) {
  switch (dtype) {
    case Dtype::f16: return "float16";
    case Dtype::bf16: return "bfloat16";
    case Dtype::f32: return "float32";
    case Dtype::f64: return "float64";
    case Dtype::i32: return "int32";
    case Dtype::i64: return "int64";
    case Dtype::u8: return "uint8";
    case Dtype::u32: return "uint32";
    case Dtype::boolean: return "bool";
  }
  return "unknown";
}

std::size_t size_of(Dtype dtype) {
  switch (dtype) {
    case Dtype::f16:
    case Dtype::bf16: return 2;
    case Dtype::f32:
    case Dtype::i32:
    case Dtype::u32: return 4;
    case Dtype::f64:
    case Dtype::i64: return 8;
    case Dtype::u8:
    case Dtype::boolean: return 1;
  }
  return 0;
}

bool is_floating(Dtype dtype) {
  return dtype == Dtype::f16 || dtype == Dtype::bf16 || dtype == Dtype::f32 || dtype == Dtype::f64;
}

float to_float(Half h) {
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
  return std::bit_cast<float>(out);
}

Half to_half(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return Half{static_cast<std::uint16_t>(sign | 0x7e00u)};  // NaN
  if (abs >= 0x47800000u) return Half{static_cast<std::uint16_t>(sign | 0x7c00u)};  // >= 65536: inf
  if (abs < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    // Scale into the subnormal grid with float arithmetic, which rounds to nearest even.
    const float scaled = std::bit_cast<float>(abs) * 16777216.0f;  // * 2^24: units of 2^-24
    const auto q = static_cast<std::uint32_t>(std::nearbyint(scaled));
    return Half{static_cast<std::uint16_t>(sign | q)};
  }
  // Normal: rebias the exponent, round the 13 dropped mantissa bits to nearest even.
  std::uint32_t v = abs - ((127u - 15u) << 23);
  v += 0xfffu + ((v >> 13) & 1u);
  return Half{static_cast<std::uint16_t>(sign | (v >> 13))};
}

void throw_unsupported_dtype(std::string_view op, std::string_view arg, Dtype got,
                             std::string_view expected) {
  throw_type_error(op, arg, expected, to_string(got));
}

}  // namespace lattice
