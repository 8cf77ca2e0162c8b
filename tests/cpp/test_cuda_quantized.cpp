// CUDA route of packed int4/int8 weights (quantized cuda_dequant_gemm, issue 7) against the CPU
// dequant_reference route (the whole weight dequantized on the CPU, then the CPU conv reference
// route; linear: a float64 host matmul on the dequantized weight): relations built on the CPU
// from random coordinates (submanifold k3 and k1 (identity), strided, target, transposed,
// generative, a single row, no rows, rows without edges), copied to the device, with and without
// the N_out x K map in the view; linear (by-output storage) with many rows; bits 4 / 8, group
// 32 / 64 / 128, f32 / f16 / bf16 activations, scales of every dtype, channel counts that are
// neither tile nor group multiples, with and without bias; SEMANTICS.md tolerances relative to
// the norm of the reference; bitwise-identical repeated runs. Also the device decoder of
// dequant_reference: bit-identical to the CPU decoder for every activation dtype.
// Skips with the reason when this build or machine has no CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "backend/kernel_table.h"
#include "cuda_test_support.h"
#include "lattice/core/array.h"
#include "lattice/core/dtype.h"
#include "lattice/tensor/coordinate_set.h"
#include "lattice/tensor/relation.h"

namespace lattice {
namespace {

using backend::QuantizedConvArgs;
using backend::QuantizedKernels;
using backend::QuantizedWeightArgs;
using backend::RelationView;

using cuda_test::kGpu;

std::string skip_reason() {
  if (std::string why = cuda_test::cuda_unavailable(); !why.empty()) return why;
  if (backend::find_quantized_kernels(RouteId::quantized_cuda_dequant_gemm) == nullptr)
    return "cuda_dequant_gemm has no kernels in this build";
  return {};
}

#define SKIP_UNLESS_CUDA() LATTICE_SKIP_IF(skip_reason())

// ---- relations -----------------------------------------------------------------------------

struct Case {
  std::string name;
  std::shared_ptr<const Relation> rel;
};

std::shared_ptr<CoordinateSet> random_set(std::int64_t n, std::int32_t extent, Int3 stride, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::int32_t> coord(-extent, extent), batch(0, 1);
  std::set<std::tuple<std::int32_t, std::int32_t, std::int32_t, std::int32_t>> seen;
  std::vector<std::int32_t> flat;
  while (static_cast<std::int64_t>(seen.size()) < n) {
    const auto row = std::make_tuple(batch(rng), coord(rng), coord(rng), coord(rng));
    if (!seen.insert(row).second) continue;
    flat.insert(flat.end(), {std::get<0>(row), std::get<1>(row), std::get<2>(row), std::get<3>(row)});
  }
  return CoordinateSet::create(Array::from_vector<std::int32_t>(flat, {n, 4}), stride);
}

KernelSpec spec_of(std::int32_t size, std::int32_t stride, std::int32_t padding = 0) {
  KernelSpec s;
  s.size = {size, size, size};
  s.stride = {stride, stride, stride};
  s.padding = {padding, padding, padding};
  return s;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  auto x = random_set(300, 5, {1, 1, 1}, 7);
  out.push_back({"subm_k3", x->relation(RelationKind::submanifold, spec_of(3, 1), nullptr, "test").relation});
  out.push_back({"subm_k1_identity", x->relation(RelationKind::submanifold, spec_of(1, 1), nullptr, "test").relation});
  out.push_back({"forward_k2s2", x->relation(RelationKind::forward, spec_of(2, 2), nullptr, "test").relation});
  auto coarse = random_set(120, 3, {2, 2, 2}, 11);
  out.push_back({"target_k3s2", x->relation(RelationKind::target, spec_of(3, 2, 1), coarse, "test").relation});
  out.push_back({"transposed_k2s2", coarse->relation(RelationKind::transposed, spec_of(2, 2), nullptr, "test").relation});
  out.push_back(
      {"generative_k2s2", coarse->relation(RelationKind::generative, spec_of(2, 2), nullptr, "test").relation});
  auto one = random_set(1, 2, {1, 1, 1}, 3);
  out.push_back({"single_row_k3", one->relation(RelationKind::submanifold, spec_of(3, 1), nullptr, "test").relation});
  auto none = CoordinateSet::create(Array::empty({0, 4}, Dtype::i32), {1, 1, 1});
  out.push_back({"no_rows_k3", none->relation(RelationKind::submanifold, spec_of(3, 1), nullptr, "test").relation});
  std::vector<std::int32_t> far;
  for (std::int32_t i = 0; i < 5; ++i) far.insert(far.end(), {0, 1000 + 3 * i, 1000, 1000});
  auto target = CoordinateSet::create(Array::from_vector<std::int32_t>(far, {5, 4}), {1, 1, 1});
  out.push_back({"no_edges_k3", x->relation(RelationKind::target, spec_of(3, 1), target, "test").relation});
  return out;
}

// The relation's arrays on one device, and the view over them.
struct Views {
  Array in_idx, out_idx, k_idx, out_ptr, k_ptr, k_in, k_out, gemm_map;
  RelationView view(const Relation& r, bool with_map) const {
    RelationView v;
    v.n_in = r.n_in;
    v.n_out = r.n_out;
    v.kernel_volume = r.kernel_volume;
    v.n_edges = r.n_edges();
    v.in_idx = in_idx.data<std::int32_t>();
    v.out_idx = out_idx.data<std::int32_t>();
    v.k_idx = k_idx.data<std::int32_t>();
    v.out_ptr = out_ptr.data<std::int64_t>();
    v.k_ptr = k_ptr.data<std::int64_t>();
    v.k_in = k_in.data<std::int32_t>();
    v.k_out = k_out.data<std::int32_t>();
    v.identity = r.identity;
    v.gemm_map = with_map ? gemm_map.data<std::int32_t>() : nullptr;
    return v;
  }
};

Views views_on(const Relation& r, Device d) {
  return Views{r.in_idx().to(d), r.out_idx().to(d), r.k_idx().to(d), r.out_ptr().to(d),
               r.k_ptr().to(d),  r.k_in().to(d),    r.k_out().to(d), r.gemm_map().to(d)};
}

// ---- data ----------------------------------------------------------------------------------

Array random_array(Shape shape, Dtype dt, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  Array a = Array::empty(std::move(shape), dt);
  std::uniform_real_distribution<float> ud(lo, hi);
  dispatch_float(dt, "test", "dtype", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = a.data<T>();
    for (std::int64_t i = 0; i < a.numel(); ++i) p[i] = store<T>(static_cast<Accum<T>>(ud(rng)));
  });
  return a;
}

// A random packed weight (host arrays): words of random codes (padding included), scales in
// [0.5, 1.5] / levels, biases in [-0.75, -0.25].
struct Packed {
  Array packed, scales, biases;
  QuantizedWeightArgs args(bool by_output) const {
    QuantizedWeightArgs a;
    a.packed = static_cast<const std::uint32_t*>(packed.raw_data());
    a.scales = scales.raw_data();
    a.biases = biases.raw_data();
    a.scale_dtype = scales.dtype();
    a.bits = bits;
    a.group_size = group;
    a.by_output = by_output;
    a.kernel_volume = kernel_volume;
    a.c_in = c_in;
    a.c_in_storage = c_in_st;
    a.c_out = c_out;
    return a;
  }
  Packed to(Device d) const {
    Packed p = *this;
    p.packed = packed.to(d);
    p.scales = scales.to(d);
    p.biases = biases.to(d);
    return p;
  }
  int bits = 4, group = 32;
  std::int64_t kernel_volume = 1, c_in = 0, c_in_st = 0, c_out = 0;
};

Packed random_packed(std::int64_t kv, std::int64_t c_in, std::int64_t c_out, int bits, int group, Dtype sd,
                     bool by_output, std::mt19937& rng) {
  Packed p;
  p.bits = bits;
  p.group = group;
  p.kernel_volume = kv;
  p.c_in = c_in;
  p.c_in_st = (c_in + group - 1) / group * group;
  p.c_out = c_out;
  const std::int64_t words = p.c_in_st * bits / 32, groups = p.c_in_st / group;
  const Shape ps = by_output ? Shape{c_out, words} : Shape{kv, words, c_out};
  const Shape ss = by_output ? Shape{c_out, groups} : Shape{kv, groups, c_out};
  p.packed = Array::empty(ps, Dtype::i32);
  auto* w = reinterpret_cast<std::uint32_t*>(p.packed.data<std::int32_t>());
  for (std::int64_t i = 0; i < p.packed.numel(); ++i) w[i] = static_cast<std::uint32_t>(rng());
  const float levels = static_cast<float>((1 << bits) - 1);
  p.scales = random_array(ss, sd, rng, 0.5f / levels, 1.5f / levels);
  p.biases = random_array(ss, sd, rng, -0.75f, -0.25f);
  return p;
}

std::vector<double> values(const Array& a) {
  const Array h = a.to(Device::cpu());
  std::vector<double> out(static_cast<std::size_t>(h.numel()));
  dispatch_float(h.dtype(), "test", "dtype", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* p = h.data<T>();
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<double>(load(p[i]));
  });
  return out;
}

bool same_bytes(const Array& a, const Array& b) {
  const Array ha = a.to(Device::cpu()), hb = b.to(Device::cpu());
  return ha.nbytes() == hb.nbytes() &&
         (ha.nbytes() == 0 || std::memcmp(ha.raw_data(), hb.raw_data(), ha.nbytes()) == 0);
}

double tolerance(Dtype dt) {
  if (dt == Dtype::f16) return 2e-3;
  if (dt == Dtype::bf16) return 1e-2;
  return 1e-5;
}

// ||got - ref|| <= tol * ||ref|| (with an absolute floor for all-zero references); every value finite.
void expect_close(const Array& got, const Array& ref, double tol, const std::string& what) {
  const std::vector<double> g = values(got), r = values(ref);
  ASSERT_EQ(g.size(), r.size()) << what;
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    ASSERT_TRUE(std::isfinite(g[i])) << what << " element " << i;
    diff += (g[i] - r[i]) * (g[i] - r[i]);
    norm += r[i] * r[i];
  }
  diff = std::sqrt(diff);
  norm = std::sqrt(norm);
  EXPECT_LE(diff, tol * std::max(norm, 1e-3)) << what << ": |diff| " << diff << " |ref| " << norm;
}

// CPU dequant_reference's decoder: (K, C_in, C_out) of dt.
Array cpu_dequantize(const Packed& p, bool by_output, Dtype dt) {
  const QuantizedKernels* k = backend::find_quantized_kernels(RouteId::quantized_dequant_reference);
  Array out = Array::empty({p.kernel_volume, p.c_in, p.c_out}, dt);
  backend::DequantizeArgs a;
  a.w = p.args(by_output);
  a.dtype = dt;
  a.out = out.raw_data();
  k->dequantize(a);
  return out;
}

constexpr Dtype kScaleDtypes[] = {Dtype::f16, Dtype::bf16, Dtype::f32};

struct Channels {
  std::int64_t c_in, c_out;
};

// ---- tests ---------------------------------------------------------------------------------

TEST(CudaQuantized, ConvMatchesCpuDequantReferenceEveryKindBitsGroupDtype) {
  SKIP_UNLESS_CUDA();
  const QuantizedKernels* gpu = backend::find_quantized_kernels(RouteId::quantized_cuda_dequant_gemm);
  ASSERT_NE(gpu->forward, nullptr);
  std::mt19937 rng(2024);
  int combo = 0;
  for (const Case& c : cases()) {
    const Relation& r = *c.rel;
    const Views host = views_on(r, Device::cpu());
    const Views dev = views_on(r, kGpu);
    for (Dtype dt : {Dtype::f32, Dtype::f16, Dtype::bf16}) {
      for (int bits : {4, 8}) {
        for (int group : {32, 64, 128}) {
          const Channels ch = combo % 2 == 0 ? Channels{40, 24} : Channels{150, 70};
          const Dtype sd = kScaleDtypes[combo % 3];
          const bool with_bias = combo % 4 != 1;
          const bool with_map = combo % 5 != 2;
          ++combo;
          const std::string what = c.name + " " + std::string(to_string(dt)) + " int" + std::to_string(bits) +
                                   " g" + std::to_string(group) + " scales " + std::string(to_string(sd)) +
                                   " C_in=" + std::to_string(ch.c_in) + " C_out=" + std::to_string(ch.c_out) +
                                   (with_bias ? " bias" : "") + (with_map ? " map" : " no map");
          SCOPED_TRACE(what);
          const std::int64_t kv = r.kernel_volume;
          const Packed q = random_packed(kv, ch.c_in, ch.c_out, bits, group, sd, false, rng);
          const Packed qd = q.to(kGpu);
          const Array x = random_array({r.n_in, ch.c_in}, dt, rng);
          const Array bias = random_array({ch.c_out}, dt, rng);
          const Array xd = x.to(kGpu), bd = bias.to(kGpu);

          // CPU dequant_reference: dequantize, then the CPU conv reference route.
          const Array full = cpu_dequantize(q, false, dt);
          backend::ConvArgs ref;
          ref.dtype = dt;
          ref.rel = host.view(r, false);
          ref.c_in = ch.c_in;
          ref.c_out = ch.c_out;
          ref.x = x.raw_data();
          ref.w = full.raw_data();
          ref.bias = with_bias ? bias.raw_data() : nullptr;
          Array y_ref = Array::empty({r.n_out, ch.c_out}, dt);
          ref.y = y_ref.raw_data();
          backend::find_conv_kernels(RouteId::conv_reference)->forward(ref);

          auto run = [&] {
            QuantizedConvArgs a;
            a.dtype = dt;
            a.rel = dev.view(r, with_map);
            a.w = qd.args(false);
            a.x = xd.raw_data();
            a.bias = with_bias ? bd.raw_data() : nullptr;
            Array y = Array::empty({r.n_out, ch.c_out}, dt, kGpu);
            a.y = y.raw_data();
            a.device = kGpu;
            gpu->forward(a);
            return y;
          };
          const Array y1 = run(), y2 = run();
          expect_close(y1, y_ref, tolerance(dt), what);
          EXPECT_TRUE(same_bytes(y1, y2)) << what << ": repeated runs differ";
        }
      }
    }
  }
}

TEST(CudaQuantized, LinearMatchesDequantizedMatmul) {
  SKIP_UNLESS_CUDA();
  const QuantizedKernels* gpu = backend::find_quantized_kernels(RouteId::quantized_cuda_dequant_gemm);
  std::mt19937 rng(77);
  int combo = 0;
  for (std::int64_t n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{1000}}) {
    for (Dtype dt : {Dtype::f32, Dtype::f16, Dtype::bf16}) {
      for (int bits : {4, 8}) {
        for (int group : {32, 64, 128}) {
          const Channels ch = combo % 2 == 0 ? Channels{40, 24} : Channels{200, 130};
          const Dtype sd = kScaleDtypes[combo % 3];
          const bool with_bias = combo % 4 != 1;
          ++combo;
          const std::string what = "linear N=" + std::to_string(n) + " " + std::string(to_string(dt)) + " int" +
                                   std::to_string(bits) + " g" + std::to_string(group) + " scales " +
                                   std::string(to_string(sd)) + " C_in=" + std::to_string(ch.c_in) +
                                   " C_out=" + std::to_string(ch.c_out);
          SCOPED_TRACE(what);
          const Packed q = random_packed(1, ch.c_in, ch.c_out, bits, group, sd, true, rng);
          const Packed qd = q.to(kGpu);
          const Array x = random_array({n, ch.c_in}, dt, rng);
          const Array bias = random_array({ch.c_out}, dt, rng);
          // Reference: float64 matmul on the CPU-dequantized weight (1, C_in, C_out), rounded to dt.
          const std::vector<double> wv = values(cpu_dequantize(q, true, dt)), xv = values(x), bv = values(bias);
          Array y_ref = Array::empty({n, ch.c_out}, Dtype::f64);
          for (std::int64_t i = 0; i < n; ++i)
            for (std::int64_t o = 0; o < ch.c_out; ++o) {
              double s = with_bias ? bv[static_cast<std::size_t>(o)] : 0.0;
              for (std::int64_t ci = 0; ci < ch.c_in; ++ci)
                s += xv[static_cast<std::size_t>(i * ch.c_in + ci)] * wv[static_cast<std::size_t>(ci * ch.c_out + o)];
              y_ref.data<double>()[i * ch.c_out + o] = s;
            }
          auto run = [&] {
            QuantizedConvArgs a;
            a.dtype = dt;
            a.rel.n_in = a.rel.n_out = a.rel.n_edges = n;
            a.rel.kernel_volume = 1;
            a.rel.identity = true;
            a.w = qd.args(true);
            const Array xd = x.to(kGpu), bd = bias.to(kGpu);
            a.x = xd.raw_data();
            a.bias = with_bias ? bd.raw_data() : nullptr;
            Array y = Array::empty({n, ch.c_out}, dt, kGpu);
            a.y = y.raw_data();
            a.device = kGpu;
            gpu->forward(a);
            return values(y);
          };
          const std::vector<double> y1 = run(), y2 = run();
          ASSERT_EQ(y1.size(), static_cast<std::size_t>(n * ch.c_out));
          double diff = 0, norm = 0;
          for (std::size_t i = 0; i < y1.size(); ++i) {
            const double r = y_ref.data<double>()[i];
            diff += (y1[i] - r) * (y1[i] - r);
            norm += r * r;
          }
          EXPECT_LE(std::sqrt(diff), tolerance(dt) * std::max(std::sqrt(norm), 1e-3)) << what;
          EXPECT_EQ(y1, y2) << what << ": repeated runs differ";
        }
      }
    }
  }
}

TEST(CudaQuantized, DeviceDecoderIsBitIdenticalToCpuDecoder) {
  SKIP_UNLESS_CUDA();
  const QuantizedKernels* gpu = backend::find_quantized_kernels(RouteId::quantized_cuda_dequant_gemm);
  ASSERT_NE(gpu->dequantize, nullptr);
  std::mt19937 rng(5);
  int combo = 0;
  for (bool by_output : {false, true}) {
    for (Dtype dt : {Dtype::f32, Dtype::f16, Dtype::bf16, Dtype::f64}) {
      for (int bits : {4, 8}) {
        for (int group : {32, 64, 128}) {
          for (Dtype sd : kScaleDtypes) {
            const std::int64_t kv = by_output ? 1 : 27;
            const Channels ch = combo++ % 2 == 0 ? Channels{40, 24} : Channels{150, 70};
            const Packed q = random_packed(kv, ch.c_in, ch.c_out, bits, group, sd, by_output, rng);
            const Packed qd = q.to(kGpu);
            const Array ref = cpu_dequantize(q, by_output, dt);
            Array got = Array::empty({kv, ch.c_in, ch.c_out}, dt, kGpu);
            backend::DequantizeArgs a;
            a.w = qd.args(by_output);
            a.dtype = dt;
            a.out = got.raw_data();
            a.device = kGpu;
            gpu->dequantize(a);
            EXPECT_TRUE(same_bytes(got, ref))
                << (by_output ? "by_output " : "kernel_major ") << to_string(dt) << " int" << bits << " g" << group
                << " scales " << to_string(sd);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace lattice
