// Element types of lattice::Array, the 16-bit float storage types and the one dtype-dispatch
// helper every backend uses (DESIGN.md convention 5: no macro families).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace lattice {

enum class Dtype : std::uint8_t { f16, bf16, f32, f64, i32, i64, u8, u32, boolean };

std::string_view to_string(Dtype dtype);
std::size_t size_of(Dtype dtype);
bool is_floating(Dtype dtype);

// IEEE binary16 storage. Arithmetic happens in float after load (f32 accumulation).
struct Half {
  std::uint16_t bits = 0;
};
// bfloat16 storage: the top 16 bits of an IEEE binary32.
struct BFloat16 {
  std::uint16_t bits = 0;
};

// Conversions round to nearest, ties to even; NaN stays NaN, overflow goes to inf.
float to_float(Half h);
Half to_half(float f);
inline float to_float(BFloat16 b) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b.bits) << 16);
}
inline BFloat16 to_bfloat16(float f) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return BFloat16{static_cast<std::uint16_t>((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return BFloat16{static_cast<std::uint16_t>(u >> 16)};
}

// Storage type T -> accumulation type: f32 for every float storage except f64.
template <class T>
struct AccumOf {
  using type = float;
};
template <>
struct AccumOf<double> {
  using type = double;
};
template <class T>
using Accum = typename AccumOf<T>::type;

// load/store between a storage element and its accumulation type.
template <class T>
inline Accum<T> load(T v) {
  if constexpr (std::is_same_v<T, Half>) return to_float(v);
  else if constexpr (std::is_same_v<T, BFloat16>) return to_float(v);
  else return static_cast<Accum<T>>(v);
}
template <class T>
inline T store(Accum<T> v) {
  if constexpr (std::is_same_v<T, Half>) return to_half(v);
  else if constexpr (std::is_same_v<T, BFloat16>) return to_bfloat16(v);
  else return static_cast<T>(v);
}

template <class T>
struct TypeTag {
  using type = T;
};

template <class T>
constexpr Dtype dtype_of();
template <> constexpr Dtype dtype_of<Half>() { return Dtype::f16; }
template <> constexpr Dtype dtype_of<BFloat16>() { return Dtype::bf16; }
template <> constexpr Dtype dtype_of<float>() { return Dtype::f32; }
template <> constexpr Dtype dtype_of<double>() { return Dtype::f64; }
template <> constexpr Dtype dtype_of<std::int32_t>() { return Dtype::i32; }
template <> constexpr Dtype dtype_of<std::int64_t>() { return Dtype::i64; }
template <> constexpr Dtype dtype_of<std::uint8_t>() { return Dtype::u8; }
template <> constexpr Dtype dtype_of<std::uint32_t>() { return Dtype::u32; }
template <> constexpr Dtype dtype_of<bool>() { return Dtype::boolean; }

[[noreturn]] void throw_unsupported_dtype(std::string_view op, std::string_view arg, Dtype got,
                                          std::string_view expected);

// The dtype-dispatch helper: calls f(TypeTag<T>{}) with the storage type of a float dtype.
// `op`/`arg` name the caller for the TypeError raised on a non-float dtype.
template <class F>
decltype(auto) dispatch_float(Dtype dtype, std::string_view op, std::string_view arg, F&& f) {
  switch (dtype) {
    case Dtype::f16: return f(TypeTag<Half>{});
    case Dtype::bf16: return f(TypeTag<BFloat16>{});
    case Dtype::f32: return f(TypeTag<float>{});
    case Dtype::f64: return f(TypeTag<double>{});
    default: throw_unsupported_dtype(op, arg, dtype, "float16, bfloat16, float32 or float64");
  }
}

}  // namespace lattice
