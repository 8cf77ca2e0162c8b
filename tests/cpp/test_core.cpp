// Specification tests for the core layer (src/core, include/lattice/core): dtypes and their 16-bit
// conversions, the dtype-dispatch helper, Array construction, views and copies, the DLPack
// boundary (data, shape, strides, dtype and storage lifetime), error formats and kinds, and the
// SparseTensor device check.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

#include "lattice/core/array.h"
#include "lattice/core/device.h"
#include "lattice/core/dlpack.h"
#include "lattice/core/dtype.h"
#include "lattice/core/error.h"
#include "lattice/tensor/sparse_tensor.h"

namespace lattice {
namespace {

// The message of the exception of type E that f() throws (a test failure when it throws none).
template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception, none was thrown";
  return {};
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

float f32_from_bits(std::uint32_t bits) { return std::bit_cast<float>(bits); }

// Shared storage whose release is counted: the owner handle of Array::wrap.
struct CountedBuffer {
  std::vector<float> values;
  std::shared_ptr<int> releases = std::make_shared<int>(0);

  std::shared_ptr<void> owner() {
    auto counter = releases;
    return std::shared_ptr<void>(values.data(), [counter](void*) { ++*counter; });
  }
};

// ---- dtype names, sizes, kinds ------------------------------------------------------------------

TEST(DtypeNames, EveryDtypeHasItsPublicNameAndSize) {
  struct Case {
    Dtype dtype;
    const char* name;
    std::size_t size;
    bool floating;
  };
  const Case cases[] = {
      {Dtype::f16, "float16", 2, true},   {Dtype::bf16, "bfloat16", 2, true},
      {Dtype::f32, "float32", 4, true},   {Dtype::f64, "float64", 8, true},
      {Dtype::i32, "int32", 4, false},    {Dtype::i64, "int64", 8, false},
      {Dtype::u8, "uint8", 1, false},     {Dtype::u32, "uint32", 4, false},
      {Dtype::boolean, "bool", 1, false},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(to_string(c.dtype), c.name);
    EXPECT_EQ(size_of(c.dtype), c.size) << c.name;
    EXPECT_EQ(is_floating(c.dtype), c.floating) << c.name;
  }
}

TEST(DtypeNames, StorageTypesMapToTheirDtype) {
  static_assert(dtype_of<Half>() == Dtype::f16);
  static_assert(dtype_of<BFloat16>() == Dtype::bf16);
  static_assert(dtype_of<float>() == Dtype::f32);
  static_assert(dtype_of<double>() == Dtype::f64);
  static_assert(dtype_of<std::int32_t>() == Dtype::i32);
  static_assert(dtype_of<std::int64_t>() == Dtype::i64);
  static_assert(dtype_of<std::uint8_t>() == Dtype::u8);
  static_assert(dtype_of<std::uint32_t>() == Dtype::u32);
  static_assert(dtype_of<bool>() == Dtype::boolean);
  static_assert(std::is_same_v<Accum<Half>, float> && std::is_same_v<Accum<BFloat16>, float>);
  static_assert(std::is_same_v<Accum<float>, float> && std::is_same_v<Accum<double>, double>);
  SUCCEED();
}

// ---- Half (IEEE binary16) -----------------------------------------------------------------------

TEST(DtypeHalf, OneAndMaxAreExact) {
  EXPECT_EQ(to_half(1.0f).bits, 0x3C00);
  EXPECT_EQ(to_float(Half{0x3C00}), 1.0f);
  EXPECT_EQ(to_half(-2.0f).bits, 0xC000);
  EXPECT_EQ(to_half(65504.0f).bits, 0x7BFF);  // largest finite half
  EXPECT_EQ(to_float(Half{0x7BFF}), 65504.0f);
  EXPECT_EQ(to_half(0.0f).bits, 0x0000);
  EXPECT_EQ(to_half(-0.0f).bits, 0x8000);
}

TEST(DtypeHalf, SmallestSubnormalIsTwoToTheMinus24) {
  const float tiny = std::ldexp(1.0f, -24);
  EXPECT_EQ(to_half(tiny).bits, 0x0001);
  EXPECT_EQ(to_float(Half{0x0001}), tiny);
  EXPECT_EQ(to_half(-tiny).bits, 0x8001);
  EXPECT_EQ(to_float(Half{0x03FF}), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(to_half(std::ldexp(1.0f, -14)).bits, 0x0400);       // smallest normal
}

TEST(DtypeHalf, SubnormalTiesRoundToEven) {
  EXPECT_EQ(to_half(std::ldexp(1.0f, -25)).bits, 0x0000);  // half of 2^-24: tie -> 0 (even)
  EXPECT_EQ(to_half(std::ldexp(3.0f, -25)).bits, 0x0002);  // 1.5 units: tie -> 2 (even)
  EXPECT_EQ(to_half(std::ldexp(5.0f, -25)).bits, 0x0002);  // 2.5 units: tie -> 2 (even)
  EXPECT_EQ(to_half(std::ldexp(1.0f, -26)).bits, 0x0000);  // below half a unit
  EXPECT_EQ(to_half(std::nextafter(std::ldexp(1.0f, -25), 1.0f)).bits, 0x0001);  // above the tie
}

TEST(DtypeHalf, NormalTiesRoundToEven) {
  const float ulp = std::ldexp(1.0f, -10);              // spacing of halves in [1, 2)
  EXPECT_EQ(to_half(1.0f + ulp / 2).bits, 0x3C00);      // tie between 0x3C00 and 0x3C01 -> even
  EXPECT_EQ(to_half(1.0f + 3 * ulp / 2).bits, 0x3C02);  // tie between 0x3C01 and 0x3C02 -> even
  EXPECT_EQ(to_half(std::nextafter(1.0f + ulp / 2, 2.0f)).bits, 0x3C01);
  EXPECT_EQ(to_half(2047.0f / 1024.0f + ulp / 2).bits,
            0x4000);  // rounding carries into the exponent
}

TEST(DtypeHalf, NanStaysNanAndInfStaysInf) {
  const float inf = std::numeric_limits<float>::infinity();
  const Half nan = to_half(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan.bits & 0x7C00, 0x7C00);
  EXPECT_NE(nan.bits & 0x03FF, 0);
  EXPECT_TRUE(std::isnan(to_float(nan)));
  EXPECT_TRUE(std::isnan(to_float(to_half(f32_from_bits(0x7F800001u)))));  // signalling payload
  EXPECT_EQ(to_half(inf).bits, 0x7C00);
  EXPECT_EQ(to_half(-inf).bits, 0xFC00);
  EXPECT_EQ(to_float(Half{0x7C00}), inf);
  EXPECT_EQ(to_float(Half{0xFC00}), -inf);
}

TEST(DtypeHalf, OverflowGoesToInf) {
  EXPECT_EQ(to_half(65519.0f).bits, 0x7BFF);  // below the midpoint to 65536: rounds down
  EXPECT_EQ(to_half(65520.0f).bits, 0x7C00);  // the midpoint: ties to even -> inf
  EXPECT_EQ(to_half(1.0e6f).bits, 0x7C00);
  EXPECT_EQ(to_half(-1.0e6f).bits, 0xFC00);
  EXPECT_EQ(to_half(std::numeric_limits<float>::max()).bits, 0x7C00);
}

TEST(DtypeHalf, EveryNonNanHalfRoundTripsThroughFloat) {
  for (std::uint32_t b = 0; b <= 0xFFFF; ++b) {
    const Half h{static_cast<std::uint16_t>(b)};
    const bool is_nan = (b & 0x7C00) == 0x7C00 && (b & 0x03FF) != 0;
    if (is_nan) {
      ASSERT_TRUE(std::isnan(to_float(h))) << std::hex << b;
      continue;
    }
    ASSERT_EQ(to_half(to_float(h)).bits, b) << std::hex << b;
  }
}

// ---- BFloat16 -----------------------------------------------------------------------------------

TEST(DtypeBFloat16, OneIsExactAnd65504RoundsTo65536) {
  EXPECT_EQ(to_bfloat16(1.0f).bits, 0x3F80);
  EXPECT_EQ(to_float(BFloat16{0x3F80}), 1.0f);
  // 65504 = 0x477FE000: the dropped half 0xE000 is above the midpoint.
  EXPECT_EQ(to_bfloat16(65504.0f).bits, 0x4780);
  EXPECT_EQ(to_float(BFloat16{0x4780}), 65536.0f);
  EXPECT_EQ(to_bfloat16(-0.0f).bits, 0x8000);
}

TEST(DtypeBFloat16, KeepsFloatSubnormalsAndTwoToTheMinus24) {
  EXPECT_EQ(to_bfloat16(std::ldexp(1.0f, -24)).bits, 0x3380);  // exact: same exponent range
  EXPECT_EQ(to_float(BFloat16{0x3380}), std::ldexp(1.0f, -24));
  EXPECT_EQ(to_bfloat16(std::ldexp(1.0f, -133)).bits, 0x0001);  // float subnormal 0x00010000
  EXPECT_EQ(to_float(BFloat16{0x0001}), std::ldexp(1.0f, -133));
  EXPECT_EQ(to_bfloat16(f32_from_bits(0x00008000u)).bits, 0x0000);  // tie -> even (0)
  EXPECT_EQ(to_bfloat16(f32_from_bits(0x00018000u)).bits, 0x0002);  // tie -> even (2)
}

TEST(DtypeBFloat16, TiesRoundToEven) {
  const float ulp = std::ldexp(1.0f, -7);  // spacing of bfloat16 in [1, 2)
  EXPECT_EQ(to_bfloat16(1.0f + ulp / 2).bits, 0x3F80);
  EXPECT_EQ(to_bfloat16(1.0f + 3 * ulp / 2).bits, 0x3F82);
  EXPECT_EQ(to_bfloat16(std::nextafter(1.0f + ulp / 2, 2.0f)).bits, 0x3F81);
}

TEST(DtypeBFloat16, NanStaysNanAndOverflowGoesToInf) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isnan(to_float(to_bfloat16(std::numeric_limits<float>::quiet_NaN()))));
  // A NaN whose payload lives only in the dropped bits must not become inf.
  EXPECT_TRUE(std::isnan(to_float(to_bfloat16(f32_from_bits(0x7F800001u)))));
  EXPECT_TRUE(std::isnan(to_float(to_bfloat16(f32_from_bits(0xFF800001u)))));
  EXPECT_EQ(to_bfloat16(inf).bits, 0x7F80);
  EXPECT_EQ(to_bfloat16(-inf).bits, 0xFF80);
  EXPECT_EQ(to_bfloat16(std::numeric_limits<float>::max()).bits, 0x7F80);
  EXPECT_EQ(to_bfloat16(-std::numeric_limits<float>::max()).bits, 0xFF80);
}

TEST(DtypeBFloat16, EveryNonNanBFloat16RoundTripsThroughFloat) {
  for (std::uint32_t b = 0; b <= 0xFFFF; ++b) {
    const BFloat16 v{static_cast<std::uint16_t>(b)};
    if ((b & 0x7F80) == 0x7F80 && (b & 0x007F) != 0) {
      ASSERT_TRUE(std::isnan(to_float(v))) << std::hex << b;
      continue;
    }
    ASSERT_EQ(to_bfloat16(to_float(v)).bits, b) << std::hex << b;
  }
}

TEST(DtypeBFloat16, LoadAndStoreGoThroughTheAccumulationType) {
  EXPECT_EQ(load(to_half(0.5f)), 0.5f);
  EXPECT_EQ(store<Half>(0.5f).bits, 0x3800);
  EXPECT_EQ(store<BFloat16>(1.0f).bits, 0x3F80);
  EXPECT_EQ(store<double>(0.25), 0.25);
}

// ---- dispatch_float -----------------------------------------------------------------------------

TEST(DtypeDispatch, FloatDtypesCallWithTheirStorageType) {
  auto size = [](auto tag) { return sizeof(typename decltype(tag)::type); };
  EXPECT_EQ(dispatch_float(Dtype::f16, "op", "x", size), 2u);
  EXPECT_EQ(dispatch_float(Dtype::bf16, "op", "x", size), 2u);
  EXPECT_EQ(dispatch_float(Dtype::f32, "op", "x", size), 4u);
  EXPECT_EQ(dispatch_float(Dtype::f64, "op", "x", size), 8u);
  const Dtype seen = dispatch_float(
      Dtype::bf16, "op", "x", [](auto tag) { return dtype_of<typename decltype(tag)::type>(); });
  EXPECT_EQ(seen, Dtype::bf16);
}

TEST(DtypeDispatch, Int32RaisesTypeErrorInTheOpArgFormat) {
  for (Dtype d : {Dtype::i32, Dtype::i64, Dtype::u8, Dtype::u32, Dtype::boolean}) {
    const std::string msg = message_of<TypeError>(
        [&] { dispatch_float(d, "conv3d", "feats", [](auto) { return 0; }); });
    EXPECT_EQ(msg, "[conv3d] feats: expected float16, bfloat16, float32 or float64, got " +
                       std::string(to_string(d)));
  }
}

// ---- Array --------------------------------------------------------------------------------------

TEST(ArrayBasics, DefaultArrayIsUndefined) {
  Array a;
  EXPECT_FALSE(a.defined());
  EXPECT_EQ(a.raw_data(), nullptr);
}

TEST(ArrayBasics, EmptyIsContiguousAlignedAndSized) {
  Array a = Array::empty({3, 4, 5}, Dtype::f64);
  EXPECT_TRUE(a.defined());
  EXPECT_EQ(a.shape(), (Shape{3, 4, 5}));
  EXPECT_EQ(a.strides(), (Shape{20, 5, 1}));
  EXPECT_EQ(a.ndim(), 3);
  EXPECT_EQ(a.numel(), 60);
  EXPECT_EQ(a.nbytes(), 480u);
  EXPECT_EQ(a.dtype(), Dtype::f64);
  EXPECT_TRUE(a.device().is_cpu());
  EXPECT_TRUE(a.is_contiguous());
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a.raw_data()) % 64, 0u);
  EXPECT_EQ(a.dim(0), 3);
  EXPECT_EQ(a.dim(-1), 5);
  EXPECT_EQ(a.dim(-3), 3);
  EXPECT_THROW(a.dim(3), InternalError);
}

TEST(ArrayBasics, ZeroSizedArraysAreValid) {
  Array a = Array::empty({0, 3}, Dtype::f32);
  EXPECT_TRUE(a.defined());
  EXPECT_EQ(a.numel(), 0);
  EXPECT_EQ(a.nbytes(), 0u);
  EXPECT_TRUE(a.is_contiguous());
  EXPECT_EQ(a.clone().numel(), 0);
  EXPECT_EQ(Array::empty({}, Dtype::i32).numel(), 1);  // a scalar
}

TEST(ArrayBasics, NegativeShapeRaisesValueError) {
  const std::string msg = message_of<ValueError>([] { Array::empty({2, -1}, Dtype::f32); });
  EXPECT_EQ(msg, "[Array] shape: expected non-negative sizes, got (2, -1)");
  EXPECT_THROW(Array::zeros({-3}, Dtype::f32), ValueError);
}

TEST(ArrayBasics, ZerosIsAllZeroBytes) {
  Array a = Array::zeros({7, 9}, Dtype::i64);
  const auto* p = a.data<std::int64_t>();
  for (std::int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(p[i], 0) << i;
}

TEST(ArrayBasics, FromVectorCopiesTheValues) {
  const std::vector<std::int32_t> v{1, 2, 3, 4, 5, 6};
  Array a = Array::from_vector(v, {2, 3});
  EXPECT_EQ(a.dtype(), Dtype::i32);
  EXPECT_EQ(a.shape(), (Shape{2, 3}));
  EXPECT_EQ(std::vector<std::int32_t>(a.data<std::int32_t>(), a.data<std::int32_t>() + 6), v);
  EXPECT_EQ(Array::from_vector(v).shape(), (Shape{6}));
}

TEST(ArrayBasics, CopiesShareStorage) {
  Array a = Array::zeros({4}, Dtype::f32);
  Array b = a;
  b.data<float>()[2] = 7.0f;
  EXPECT_EQ(a.data<float>()[2], 7.0f);
}

TEST(ArrayBasics, ContiguousReturnsTheSameStorageWhenAlreadyContiguous) {
  Array a = Array::from_vector(std::vector<float>{1, 2, 3, 4}, {2, 2});
  EXPECT_EQ(a.contiguous().raw_data(), a.raw_data());
  Array c = a.clone();
  EXPECT_NE(c.raw_data(), a.raw_data());
  EXPECT_EQ(std::memcmp(c.raw_data(), a.raw_data(), a.nbytes()), 0);
}

TEST(ArrayBasics, CloneOfAStridedViewGathersInRowMajorOrder) {
  // A (3, 4) row-major matrix viewed transposed: shape (4, 3), strides (1, 4).
  CountedBuffer buf{std::vector<float>(12)};
  std::iota(buf.values.begin(), buf.values.end(), 0.0f);
  Array t = Array::wrap(buf.values.data(), {4, 3}, {1, 4}, Dtype::f32, Device::cpu(), buf.owner());
  EXPECT_FALSE(t.is_contiguous());
  for (Array c : {t.clone(), t.contiguous()}) {
    EXPECT_TRUE(c.is_contiguous());
    EXPECT_EQ(c.shape(), (Shape{4, 3}));
    EXPECT_EQ(c.strides(), (Shape{3, 1}));
    EXPECT_NE(c.raw_data(), t.raw_data());
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 3; ++j)
        EXPECT_EQ(c.data<float>()[i * 3 + j], static_cast<float>(j * 4 + i));
  }
  // Every other row and column of the (3, 4) matrix: shape (2, 2), strides (8, 2).
  Array sub =
      Array::wrap(buf.values.data(), {2, 2}, {8, 2}, Dtype::f32, Device::cpu(), buf.owner());
  Array s = sub.clone();
  EXPECT_EQ(std::vector<float>(s.data<float>(), s.data<float>() + 4),
            (std::vector<float>{0, 2, 8, 10}));
}

TEST(ArrayBasics, StridedViewSharesStorageAndChecksItsBounds) {
  // A dense (C_out=2, K=3, C_in=4) weight viewed kernel-major (K, C_in, C_out): element (k, i, o)
  // at o*12 + k*4 + i, i.e. strides (4, 1, 12); its gather equals the permutation.
  Array w = Array::empty({2, 3, 4}, Dtype::f32);
  std::iota(w.data<float>(), w.data<float>() + 24, 0.0f);
  Array v = w.strided_view({3, 4, 2}, {4, 1, 12});
  EXPECT_EQ(v.raw_data(), w.raw_data());
  EXPECT_FALSE(v.is_contiguous());
  Array c = v.contiguous();
  for (int k = 0; k < 3; ++k)
    for (int i = 0; i < 4; ++i)
      for (int o = 0; o < 2; ++o) EXPECT_EQ(c.data<float>()[(k * 4 + i) * 2 + o], static_cast<float>(o * 12 + k * 4 + i));
  EXPECT_THROW(w.strided_view({3, 4, 3}, {4, 1, 12}), ValueError);  // index 2*12 + 11 = 35 > 23
  EXPECT_THROW(w.strided_view({3, 4}, {4}), ValueError);
  EXPECT_NO_THROW(w.strided_view({0, 4}, {1000, 1}));  // empty: addresses nothing
}

TEST(ArrayBasics, ContiguousAsGathersAndConvertsWithOneRounding) {
  // The permuted view of a dense weight converted f32 -> f16 / bf16 / f64 and back: each element
  // is the permuted source rounded once to nearest even (1 + 2^-11 is a tie that rounds to 1 in
  // f16; 1 + 3*2^-11 rounds up to 1 + 2^-9), and widening back is exact.
  Array w = Array::empty({2, 3, 4}, Dtype::f32);
  for (int i = 0; i < 24; ++i) w.data<float>()[i] = 1.0f + static_cast<float>(i) * 0x1p-11f;
  Array v = w.strided_view({3, 4, 2}, {4, 1, 12});
  for (Dtype d : {Dtype::f16, Dtype::bf16, Dtype::f64, Dtype::f32}) {
    Array c = v.contiguous_as(d);
    ASSERT_EQ(c.dtype(), d);
    ASSERT_TRUE(c.is_contiguous());
    Array back = c.contiguous_as(d == Dtype::f64 ? Dtype::f64 : Dtype::f32);
    for (int k = 0; k < 3; ++k)
      for (int i = 0; i < 4; ++i)
        for (int o = 0; o < 2; ++o) {
          const float src = w.data<float>()[o * 12 + k * 4 + i];
          const float want = d == Dtype::f16 ? to_float(to_half(src)) : d == Dtype::bf16 ? to_float(to_bfloat16(src)) : src;
          const std::int64_t at = (k * 4 + i) * 2 + o;
          const double got = d == Dtype::f64 ? back.data<double>()[at] : back.data<float>()[at];
          EXPECT_EQ(got, static_cast<double>(want)) << to_string(d) << " at " << at;
        }
  }
  EXPECT_EQ(to_float(to_half(1.0f + 0x1p-11f)), 1.0f);           // tie to even
  EXPECT_EQ(to_float(to_half(1.0f + 3 * 0x1p-11f)), 1.0f + 0x1p-9f);
  Array same = w.contiguous_as(Dtype::f32);
  EXPECT_EQ(same.raw_data(), w.raw_data());  // already contiguous in that dtype: the array itself
  EXPECT_THROW(Array::empty({2}, Dtype::i32).contiguous_as(Dtype::f32), TypeError);
  EXPECT_THROW(w.contiguous_as(Dtype::i64), TypeError);
  EXPECT_THROW(w.contiguous_as(Dtype::f64).contiguous_as(Dtype::f16), TypeError);  // f64 -> 16-bit refused
}

TEST(CudaArray, ContiguousAsEqualsTheCpuConversion) {
  // The device's converting gather (the allocator's strided_convert) gives the CPU's bits for
  // every pair of float dtypes it admits, through a permuted view.
  if (!has_device_allocator(DeviceType::cuda)) GTEST_SKIP() << "this build has no CUDA allocator";
  try {
    Array::empty({1}, Dtype::f32, Device::cuda(0));
  } catch (const UnsupportedError& e) {
    GTEST_SKIP() << "no usable CUDA device: " << e.what();
  }
  Array w = Array::empty({5, 7, 3}, Dtype::f32);
  for (int i = 0; i < 105; ++i) w.data<float>()[i] = std::sin(static_cast<float>(i)) * 1000.0f + 0x1p-13f * i;
  const std::vector<std::pair<Dtype, Dtype>> pairs = {
      {Dtype::f32, Dtype::f16}, {Dtype::f32, Dtype::bf16}, {Dtype::f16, Dtype::f32}, {Dtype::bf16, Dtype::f32},
      {Dtype::f16, Dtype::bf16}, {Dtype::bf16, Dtype::f16}, {Dtype::f32, Dtype::f64}, {Dtype::f64, Dtype::f32}};
  for (auto [from, to] : pairs) {
    Array src = w.contiguous_as(from);
    Array cpu = src.strided_view({7, 3, 5}, {3, 1, 21}).contiguous_as(to);
    Array dev = src.to(Device::cuda(0)).strided_view({7, 3, 5}, {3, 1, 21}).contiguous_as(to).to(Device::cpu());
    ASSERT_EQ(dev.dtype(), to);
    EXPECT_EQ(std::memcmp(cpu.raw_data(), dev.raw_data(), cpu.nbytes()), 0)
        << to_string(from) << " -> " << to_string(to);
  }
}

TEST(ArrayBasics, UnitAxesDoNotBreakContiguity) {
  float v[4] = {};
  Array a = Array::wrap(v, {1, 4}, {99, 1}, Dtype::f32, Device::cpu(), nullptr);
  EXPECT_TRUE(a.is_contiguous());
}

TEST(ArrayBasics, ReshapeKeepsStorageAndChecksTheElementCount) {
  Array a = Array::from_vector(std::vector<float>{0, 1, 2, 3, 4, 5}, {2, 3});
  Array r = a.reshape({3, 2});
  EXPECT_EQ(r.shape(), (Shape{3, 2}));
  EXPECT_EQ(r.strides(), (Shape{2, 1}));
  EXPECT_EQ(r.raw_data(), a.raw_data());
  EXPECT_EQ(a.reshape({6}).shape(), (Shape{6}));
  EXPECT_EQ(message_of<ValueError>([&] {
              a.reshape({4, 2});
            }),
            "[Array] reshape: expected 6 elements, got shape (4, 2)");
  EXPECT_EQ(message_of<ValueError>([&] { a.reshape({5}); }),
            "[Array] reshape: expected 6 elements, got shape (5,)");
  EXPECT_THROW(a.reshape({-2, -3}), ValueError);
}

TEST(ArrayBasics, ReshapeOfAStridedViewCopiesFirst) {
  float v[6] = {0, 1, 2, 3, 4, 5};  // (2, 3) seen as (3, 2) transposed
  Array t = Array::wrap(v, {3, 2}, {1, 3}, Dtype::f32, Device::cpu(), nullptr);
  Array r = t.reshape({6});
  EXPECT_NE(r.raw_data(), static_cast<void*>(v));
  EXPECT_EQ(std::vector<float>(r.data<float>(), r.data<float>() + 6),
            (std::vector<float>{0, 3, 1, 4, 2, 5}));
}

TEST(ArrayBasics, WrapKeepsTheOwnerAliveUntilTheLastCopyDies) {
  CountedBuffer buf{std::vector<float>{1, 2, 3}};
  {
    Array a = Array::wrap(buf.values.data(), {3}, {}, Dtype::f32, Device::cpu(), buf.owner());
    EXPECT_EQ(a.strides(), (Shape{1}));
    Array b = a;
    a = Array();
    EXPECT_EQ(*buf.releases, 0);
    EXPECT_EQ(b.data<float>()[1], 2.0f);
  }
  EXPECT_EQ(*buf.releases, 1);
}

TEST(ArrayBasics, EmptyOnCudaWithoutARegisteredAllocatorRaisesUnsupportedError) {
  if (has_device_allocator(DeviceType::cuda))
    GTEST_SKIP() << "this build registers a CUDA allocator";
  const std::string msg =
      message_of<UnsupportedError>([] { Array::empty({4}, Dtype::f32, Device::cuda(0)); });
  EXPECT_TRUE(contains(msg, "[Array] device: expected cpu, got cuda:0")) << msg;
  EXPECT_TRUE(contains(msg, "without CUDA")) << msg;
  EXPECT_THROW(Array::zeros({4}, Dtype::f32, Device::cuda(1)), UnsupportedError);
}

TEST(ArrayBasics, CloneOfAStridedCudaArrayGathersOrRaisesUnsupportedError) {
  // With a usable device a strided CUDA array is gathered on the device (every other element
  // here); without one (or without the CUDA backend) the error is UnsupportedError naming the
  // device, never a raw CUDA failure.
  try {
    Array dev = Array::from_vector<std::int32_t>({1, -2, 3, -4}).to(Device::cuda(0));
    Array back = dev.strided_view({2}, {2}).clone().to(Device::cpu());
    ASSERT_EQ(back.numel(), 2);
    EXPECT_EQ(back.data<std::int32_t>()[0], 1);
    EXPECT_EQ(back.data<std::int32_t>()[1], 3);
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
    // the refusal must be about the device, not the strides (that would be the gather missing)
    EXPECT_EQ(std::string(e.what()).find("got strides"), std::string::npos) << e.what();
  }
}

TEST(ArrayBasics, CudaAllocationWorksOrRaisesUnsupportedError) {
  // With a usable device the round trip is exact; without one (or without the CUDA backend)
  // the error is UnsupportedError naming the device, never a raw CUDA failure.
  try {
    Array host = Array::from_vector<std::int32_t>({1, -2, 3});
    Array back = host.to(Device::cuda(0)).clone().to(Device::cpu());
    ASSERT_EQ(back.numel(), 3);
    EXPECT_EQ(back.data<std::int32_t>()[1], -2);
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
  }
}

// ---- DLPack -------------------------------------------------------------------------------------

TEST(ArrayDlpack, ExportDescribesTheArrayExactly) {
  CountedBuffer buf{std::vector<float>(12)};
  Array a = Array::wrap(buf.values.data(), {2, 3}, {6, 2}, Dtype::f32, Device::cpu(), buf.owner());
  LatticeDLManagedTensor* m = a.to_dlpack();
  ASSERT_NE(m, nullptr);
  const LatticeDLTensor& t = m->dl_tensor;
  EXPECT_EQ(t.data, buf.values.data());
  EXPECT_EQ(t.device.device_type, kLatticeDLCPU);
  EXPECT_EQ(t.device.device_id, 0);
  EXPECT_EQ(t.ndim, 2);
  EXPECT_EQ(t.dtype.code, kLatticeDLFloat);
  EXPECT_EQ(t.dtype.bits, 32);
  EXPECT_EQ(t.dtype.lanes, 1);
  EXPECT_EQ(Shape(t.shape, t.shape + 2), (Shape{2, 3}));
  ASSERT_NE(t.strides, nullptr);
  EXPECT_EQ(Shape(t.strides, t.strides + 2), (Shape{6, 2}));
  EXPECT_EQ(t.byte_offset, 0u);
  m->deleter(m);
}

TEST(ArrayDlpack, DtypeCodesFollowTheSpecification) {
  struct Case {
    Dtype dtype;
    std::uint8_t code;
    std::uint8_t bits;
  };
  const Case cases[] = {{Dtype::f16, kLatticeDLFloat, 16},  {Dtype::bf16, kLatticeDLBfloat, 16},
                        {Dtype::f32, kLatticeDLFloat, 32},  {Dtype::f64, kLatticeDLFloat, 64},
                        {Dtype::i32, kLatticeDLInt, 32},    {Dtype::i64, kLatticeDLInt, 64},
                        {Dtype::u8, kLatticeDLUInt, 8},     {Dtype::u32, kLatticeDLUInt, 32},
                        {Dtype::boolean, kLatticeDLBool, 8}};
  for (const Case& c : cases) {
    Array a = Array::zeros({2}, c.dtype);
    LatticeDLManagedTensor* m = a.to_dlpack();
    EXPECT_EQ(m->dl_tensor.dtype.code, c.code) << to_string(c.dtype);
    EXPECT_EQ(m->dl_tensor.dtype.bits, c.bits) << to_string(c.dtype);
    Array back = Array::from_dlpack(m);  // takes ownership; the deleter runs with `back`
    EXPECT_EQ(back.dtype(), c.dtype);
  }
}

TEST(ArrayDlpack, RoundTripKeepsDataShapeStridesDtypeAndStorage) {
  CountedBuffer buf{std::vector<float>(24)};
  std::iota(buf.values.begin(), buf.values.end(), 0.0f);
  Array a = Array::wrap(buf.values.data(), {3, 4}, {8, 2}, Dtype::f32, Device::cpu(), buf.owner());
  LatticeDLManagedTensor* m = a.to_dlpack();
  a = Array();  // the export alone keeps the storage alive
  EXPECT_EQ(*buf.releases, 0);
  Array b = Array::from_dlpack(m);
  EXPECT_EQ(b.raw_data(), buf.values.data());
  EXPECT_EQ(b.shape(), (Shape{3, 4}));
  EXPECT_EQ(b.strides(), (Shape{8, 2}));
  EXPECT_EQ(b.dtype(), Dtype::f32);
  EXPECT_TRUE(b.device().is_cpu());
  EXPECT_FALSE(b.is_contiguous());
  Array c = b.clone();
  EXPECT_EQ(c.data<float>()[5], 10.0f);  // row 1, column 1 -> element 8 + 2
  Array d = b;
  b = Array();
  c = Array();
  EXPECT_EQ(*buf.releases, 0);
  d = Array();  // last reference: the DLPack deleter runs, then the wrapped owner is released
  EXPECT_EQ(*buf.releases, 1);
}

// A producer-side DLPack tensor whose deleter calls are counted.
struct Producer {
  std::vector<double> values{0.5, 1.5, 2.5, 3.5, 4.5, 5.5};
  std::int64_t shape[2] = {2, 3};
  int deletes = 0;
  LatticeDLManagedTensor managed{};

  LatticeDLManagedTensor* make(LatticeDLDataType dtype = {kLatticeDLFloat, 64, 1},
                               std::int64_t* strides = nullptr, std::uint64_t byte_offset = 0) {
    managed.dl_tensor =
        LatticeDLTensor{values.data(), {kLatticeDLCPU, 0}, 2, dtype, shape, strides, byte_offset};
    managed.manager_ctx = this;
    managed.deleter = [](LatticeDLManagedTensor* self) {
      ++static_cast<Producer*>(self->manager_ctx)->deletes;
    };
    return &managed;
  }
};

TEST(ArrayDlpack, ImportCallsTheProducersDeleterExactlyOnceWhenTheLastArrayDies) {
  Producer p;
  {
    Array a = Array::from_dlpack(p.make());
    EXPECT_EQ(a.shape(), (Shape{2, 3}));
    EXPECT_EQ(a.strides(), (Shape{3, 1}));  // null strides: compact row-major
    EXPECT_EQ(a.dtype(), Dtype::f64);
    EXPECT_EQ(a.data<double>()[4], 4.5);
    Array copy = a;
    a = Array();
    EXPECT_EQ(p.deletes, 0);
  }
  EXPECT_EQ(p.deletes, 1);
}

TEST(ArrayDlpack, ImportAppliesTheByteOffset) {
  Producer p;
  Array a = Array::from_dlpack(p.make({kLatticeDLFloat, 64, 1}, nullptr, sizeof(double)));
  EXPECT_EQ(a.raw_data(), static_cast<void*>(p.values.data() + 1));
  EXPECT_EQ(a.data<double>()[0], 1.5);
}

TEST(ArrayDlpack, RejectedImportsStillCallTheDeleter) {
  Producer p;
  EXPECT_EQ(message_of<TypeError>([&] {
              Array::from_dlpack(p.make({kLatticeDLComplex, 64, 1}));
            }).rfind("[from_dlpack] dtype: expected", 0),
            0u);
  EXPECT_EQ(p.deletes, 1);
  EXPECT_THROW(Array::from_dlpack(p.make({kLatticeDLFloat, 32, 4})), TypeError);  // lanes
  EXPECT_EQ(p.deletes, 2);
  LatticeDLManagedTensor* m = p.make();
  m->dl_tensor.device.device_type = 4;  // OpenCL
  EXPECT_THROW(Array::from_dlpack(m), TypeError);
  EXPECT_EQ(p.deletes, 3);
  EXPECT_THROW(Array::from_dlpack(nullptr), ValueError);
}

TEST(ArrayDlpack, CudaDevicesCrossWithTheirIndex) {
  int fake = 0;  // never dereferenced
  Array a = Array::wrap(&fake, {1}, {}, Dtype::i32, Device::cuda(3), nullptr);
  LatticeDLManagedTensor* m = a.to_dlpack();
  EXPECT_EQ(m->dl_tensor.device.device_type, kLatticeDLCUDA);
  EXPECT_EQ(m->dl_tensor.device.device_id, 3);
  Array b = Array::from_dlpack(m);
  EXPECT_EQ(b.device(), Device::cuda(3));
}

// ---- errors, devices ----------------------------------------------------------------------------

TEST(CoreErrors, FormatErrorIsOpArgExpectedGot) {
  EXPECT_EQ(format_error("conv3d", "weight", "(C_out, 3, 3, 3, C_in=32)", "(64, 3, 3, 3, 16)"),
            "[conv3d] weight: expected (C_out, 3, 3, 3, C_in=32), got (64, 3, 3, 3, 16)");
}

TEST(CoreErrors, FormatShapeWritesPythonTuples) {
  EXPECT_EQ(format_shape(Shape{}), "()");
  EXPECT_EQ(format_shape(Shape{5}), "(5,)");
  EXPECT_EQ(format_shape(Shape{64, 3, 3, 3, 16}), "(64, 3, 3, 3, 16)");
  EXPECT_EQ(format_shape(Shape{0, -1}), "(0, -1)");
}

TEST(CoreErrors, EachKindIsAnErrorAndARuntimeError) {
  static_assert(std::is_base_of_v<Error, ValueError> && std::is_base_of_v<Error, TypeError>);
  static_assert(std::is_base_of_v<Error, UnsupportedError> &&
                std::is_base_of_v<Error, InternalError>);
  static_assert(std::is_base_of_v<std::runtime_error, Error>);
  static_assert(!std::is_base_of_v<ValueError, TypeError> &&
                !std::is_base_of_v<ValueError, UnsupportedError>);
  EXPECT_EQ(message_of<ValueError>([] { throw_value_error("op", "x", "a", "b"); }),
            "[op] x: expected a, got b");
  EXPECT_EQ(message_of<TypeError>([] { throw_type_error("op", "y", "c", "d"); }),
            "[op] y: expected c, got d");
}

TEST(CoreErrors, AssertRaisesInternalErrorNamingTheSite) {
  const std::string msg =
      message_of<InternalError>([] { LATTICE_ASSERT(1 + 1 == 3, "arithmetic broke"); });
  EXPECT_TRUE(contains(msg, "test_core.cpp:")) << msg;
  EXPECT_TRUE(contains(msg, "arithmetic broke")) << msg;
  EXPECT_TRUE(contains(msg, "bug in lattice")) << msg;
  EXPECT_NO_THROW(LATTICE_ASSERT(true, "never"));
}

TEST(CoreDevice, NamesAndEquality) {
  EXPECT_EQ(to_string(Device::cpu()), "cpu");
  EXPECT_EQ(to_string(Device::cuda()), "cuda:0");
  EXPECT_EQ(to_string(Device::cuda(2)), "cuda:2");
  EXPECT_EQ(Device::cuda(1), Device::cuda(1));
  EXPECT_NE(Device::cuda(0), Device::cuda(1));
  EXPECT_NE(Device::cpu(), Device::cuda(0));
  EXPECT_TRUE(Device{}.is_cpu());
  EXPECT_TRUE(has_device_allocator(DeviceType::cpu));
}

// ---- SparseTensor device check ------------------------------------------------------------------

TEST(CoreSparseTensor, FeatsOnAnotherDeviceThanCoordsRaiseValueError) {
  Array coords = Array::from_vector(std::vector<std::int32_t>{0, 0, 0, 0, 0, 1, 0, 0}, {2, 4});
  float fake[1] = {};  // a device pointer stand-in: never dereferenced
  Array feats = Array::wrap(fake, {2, 3}, {}, Dtype::f32, Device::cuda(0), nullptr);
  const std::string msg = message_of<ValueError>([&] { (void)SparseTensor(coords, feats); });
  EXPECT_EQ(msg, "[SparseTensor] feats: expected the device of coords (cpu), got cuda:0");
}

TEST(CoreSparseTensor, FeatsOnTheSameDeviceAreAccepted) {
  Array coords = Array::from_vector(std::vector<std::int32_t>{0, 0, 0, 0, 0, 1, 0, 0}, {2, 4});
  SparseTensor x(coords, Array::zeros({2, 3}, Dtype::f32));
  EXPECT_EQ(x.size(), 2);
  EXPECT_EQ(x.channels(), 3);
  EXPECT_THROW(SparseTensor(coords, Array::zeros({2, 3}, Dtype::i32)), TypeError);
  EXPECT_THROW(SparseTensor(coords, Array::zeros({3, 3}, Dtype::f32)), ValueError);
}

}  // namespace
}  // namespace lattice
