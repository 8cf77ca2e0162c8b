// CUDA convolution routes (src/backend/cuda/conv) against the CPU reference route: relations
// built on the CPU from random coordinates (submanifold k3, strided k2 s2, transposed k2 s2, a
// single row, no rows, rows without edges), copied to the device; every pass (forward with and
// without bias, input gradient, weight gradient, bias gradient) in f32 / f16 / bf16 with channel
// counts that are not multiples of the tiles; SEMANTICS.md tolerances (relative to the norm of
// the reference); bitwise-identical repeated runs. Skips with the reason when this build or
// machine has no CUDA device (or no sm_80+ device for implicit_gemm_sm80).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "backend/kernel_table.h"
#include "lattice/core/array.h"
#include "lattice/core/dtype.h"
#include "lattice/tensor/coordinate_set.h"
#include "lattice/tensor/relation.h"

namespace lattice {
namespace {

using backend::ConvArgs;
using backend::ConvKernels;
using backend::RelationView;

const Device kGpu = Device::cuda(0);

// Empty when the route can run here, else why not.
std::string skip_reason(RouteId id) {
  const DeviceCaps caps = backend::device_caps();
  if (!caps.cuda.built) return "CUDA backend not built: " + caps.cuda.status;
  if (caps.cuda.device_count == 0) return "no CUDA device: " + caps.cuda.status;
  if (backend::find_conv_kernels(id) == nullptr) return "route has no kernels in this build";
  if (id == RouteId::conv_implicit_gemm_sm80 &&
      static_cast<int>(caps.cuda.tier) < static_cast<int>(GpuTier::tensor_core))
    return "implicit_gemm_sm80 needs sm_80+, device is sm_" + std::to_string(caps.cuda.sm);
  return {};
}

#define SKIP_UNLESS_RUNNABLE(id)                                         \
  do {                                                                   \
    const std::string why_ = skip_reason(id);                            \
    if (!why_.empty()) {                                                 \
      std::printf("[  SKIPPED ] %s\n", why_.c_str());                    \
      GTEST_SKIP() << why_;                                              \
    }                                                                    \
  } while (0)

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

KernelSpec spec_of(std::int32_t size, std::int32_t stride) {
  KernelSpec s;
  s.size = {size, size, size};
  s.stride = {stride, stride, stride};
  return s;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  auto x = random_set(400, 5, {1, 1, 1}, 7);
  out.push_back({"subm_k3", x->relation(RelationKind::submanifold, spec_of(3, 1), nullptr, "test").relation});
  out.push_back({"strided_k2s2", x->relation(RelationKind::forward, spec_of(2, 2), nullptr, "test").relation});
  auto coarse = random_set(150, 3, {2, 2, 2}, 11);
  out.push_back(
      {"transposed_k2s2", coarse->relation(RelationKind::transposed, spec_of(2, 2), nullptr, "test").relation});
  auto one = random_set(1, 2, {1, 1, 1}, 3);
  out.push_back({"single_row_k3", one->relation(RelationKind::submanifold, spec_of(3, 1), nullptr, "test").relation});
  auto none = CoordinateSet::create(Array::empty({0, 4}, Dtype::i32), {1, 1, 1});
  out.push_back({"no_rows_k3", none->relation(RelationKind::submanifold, spec_of(3, 1), nullptr, "test").relation});
  // Output rows far from every input: n_out > 0, no edges.
  std::vector<std::int32_t> far;
  for (std::int32_t i = 0; i < 5; ++i) far.insert(far.end(), {0, 1000 + 3 * i, 1000, 1000});
  auto target = CoordinateSet::create(Array::from_vector<std::int32_t>(far, {5, 4}), {1, 1, 1});
  out.push_back({"no_edges_k3", x->relation(RelationKind::target, spec_of(3, 1), target, "test").relation});
  return out;
}

// The relation's arrays on one device, and the view over them.
struct Views {
  Array in_idx, out_idx, k_idx, out_ptr, k_ptr, k_in, k_out, in_ptr, kt_in, kt_out, gemm_map;
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
    v.in_ptr = in_ptr.data<std::int64_t>();
    v.kt_in = kt_in.data<std::int32_t>();
    v.kt_out = kt_out.data<std::int32_t>();
    v.gemm_map = with_map ? gemm_map.data<std::int32_t>() : nullptr;
    return v;
  }
};

Views views_on(const Relation& r, Device d) {
  const Relation::InputGrouping& g = r.input_grouping();
  return Views{r.in_idx().to(d),  r.out_idx().to(d),  r.k_idx().to(d),  r.out_ptr().to(d),
               r.k_ptr().to(d),   r.k_in().to(d),     r.k_out().to(d),  g.in_ptr.to(d),
               g.kt_in.to(d),   g.kt_out.to(d),   r.gemm_map().to(d)};
}

// ---- data ----------------------------------------------------------------------------------

Array random_array(Shape shape, Dtype dt, std::mt19937& rng) {
  Array a = Array::empty(std::move(shape), dt);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  dispatch_float(dt, "test", "dtype", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = a.data<T>();
    for (std::int64_t i = 0; i < a.numel(); ++i) p[i] = store<T>(static_cast<Accum<T>>(nd(rng)));
  });
  return a;
}

// Drops the low 13 mantissa bits of every f32 value, so each is exactly representable in tf32
// and tensor cores multiply it without rounding (any rounding rule gives the same product).
void snap_to_tf32(Array& a) {
  auto* p = a.data<std::uint32_t>();
  for (std::int64_t i = 0; i < a.numel(); ++i) p[i] &= 0xffffe000u;
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

double tolerance(Dtype dt, bool tf32) {
  if (dt == Dtype::f16) return 2e-3;
  if (dt == Dtype::bf16) return 1e-2;
  return tf32 ? 5e-4 : 1e-5;
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

// ---- the check -----------------------------------------------------------------------------

struct Channels {
  std::int64_t c_in, c_out;
};

// The arguments of one conv call on `device`, outputs and bias unset.
ConvArgs conv_args(Dtype dt, const RelationView& rel, Channels ch, const void* x, const void* w, const void* dy,
                   Device device = Device::cpu(), bool allow_tf32 = false) {
  ConvArgs a;
  a.dtype = dt;
  a.rel = rel;
  a.c_in = ch.c_in;
  a.c_out = ch.c_out;
  a.x = x;
  a.w = w;
  a.dy = dy;
  a.device = device;
  a.allow_tf32 = allow_tf32;
  return a;
}

// A device copy of `a` starting `shift` elements past a fresh allocation (shift 1: not 16-byte
// aligned), kept alive by `keep`.
const void* shifted_on_gpu(const Array& a, std::int64_t shift, Array& keep) {
  if (shift == 0) {
    keep = a.to(kGpu);
    return keep.raw_data();
  }
  Array padded = Array::zeros({a.numel() + shift}, a.dtype());
  const std::size_t es = a.nbytes() / static_cast<std::size_t>(std::max<std::int64_t>(a.numel(), 1));
  if (a.nbytes() > 0) std::memcpy(static_cast<char*>(padded.raw_data()) + shift * es, a.raw_data(), a.nbytes());
  keep = padded.to(kGpu);
  return static_cast<const char*>(keep.raw_data()) + shift * es;
}

void check_route(RouteId id, Dtype dt, bool allow_tf32,
                 const std::vector<Channels>& channels = {Channels{13, 21}, Channels{64, 64}, Channels{3, 1},
                                                          Channels{70, 130}},
                 const std::vector<Case>& case_list = cases(), std::int64_t shift = 0) {
  const ConvKernels* gpu = backend::find_conv_kernels(id);
  ASSERT_NE(gpu, nullptr);
  const bool tf32 = dt == Dtype::f32 && allow_tf32;
  const double tol = tolerance(dt, tf32);
  std::mt19937 rng(1234);
  for (const Case& c : case_list) {
    const Relation& r = *c.rel;
    const Views host = views_on(r, Device::cpu());
    const Views dev = views_on(r, kGpu);
    for (const Channels ch : channels) {
      const std::string what = std::string(to_string(id)) + " " + c.name + " " + std::string(to_string(dt)) +
                               " C_in=" + std::to_string(ch.c_in) + " C_out=" + std::to_string(ch.c_out);
      SCOPED_TRACE(what);
      const std::int64_t kv = r.kernel_volume;
      Array x = random_array({r.n_in, ch.c_in}, dt, rng);
      Array w = random_array({kv, ch.c_in, ch.c_out}, dt, rng);
      const Array bias = random_array({ch.c_out}, dt, rng);
      Array dy = random_array({r.n_out, ch.c_out}, dt, rng);
      // SEMANTICS.md's tf32 tolerance (5e-4 of ||ref||) is statistical: rounding both operands
      // to tf32 gives a relative error of about 2^-11 * sqrt(2/3) = 4e-4 rms per output, so a
      // problem with few outputs (one row, a dozen channels) can exceed it by chance. Those
      // problems get tf32-exact inputs instead, which makes the check exact at the f32 tolerance.
      double case_tol = tol;
      if (tf32 && std::min(r.n_out * ch.c_out, r.n_in * ch.c_in) < 4096) {
        snap_to_tf32(x);
        snap_to_tf32(w);
        snap_to_tf32(dy);
        case_tol = tolerance(dt, false);
      }
      Array xd, wd, dyd;
      const void* xp = shifted_on_gpu(x, shift, xd);
      const void* wp = shifted_on_gpu(w, shift, wd);
      const void* dyp = shifted_on_gpu(dy, shift, dyd);
      const Array bd = bias.to(kGpu);

      // CPU reference.
      ConvArgs ref = conv_args(dt, host.view(r, false), ch, x.raw_data(), w.raw_data(), dy.raw_data());
      Array y_ref = Array::empty({r.n_out, ch.c_out}, dt);
      Array yb_ref = Array::empty({r.n_out, ch.c_out}, dt);
      Array dx_ref = Array::empty({r.n_in, ch.c_in}, dt);
      Array dw_ref = Array::empty({kv, ch.c_in, ch.c_out}, dt);
      ref.y = y_ref.raw_data();
      backend::find_conv_kernels(RouteId::conv_reference)->forward(ref);
      ref.bias = bias.raw_data();
      ref.y = yb_ref.raw_data();
      backend::find_conv_kernels(RouteId::conv_reference)->forward(ref);
      ref.dx = dx_ref.raw_data();
      backend::find_conv_kernels(RouteId::conv_reference)->input_grad(ref);
      ref.dw = dw_ref.raw_data();
      backend::find_conv_kernels(RouteId::conv_reference)->weight_grad(ref);
      // Bias gradient: column sums of dy in double.
      Array db_ref = Array::empty({ch.c_out}, Dtype::f64);
      {
        const std::vector<double> d = values(dy);
        for (std::int64_t j = 0; j < ch.c_out; ++j) {
          double s = 0;
          for (std::int64_t i = 0; i < r.n_out; ++i) s += d[static_cast<std::size_t>(i * ch.c_out + j)];
          db_ref.data<double>()[j] = s;
        }
      }

      // Two GPU runs of every pass.
      auto run = [&](bool with_map) {
        ConvArgs a = conv_args(dt, dev.view(r, with_map), ch, xp, wp, dyp, kGpu, allow_tf32);
        std::vector<Array> outs{Array::empty({r.n_out, ch.c_out}, dt, kGpu),
                                Array::empty({r.n_out, ch.c_out}, dt, kGpu),
                                Array::empty({r.n_in, ch.c_in}, dt, kGpu),
                                Array::empty({kv, ch.c_in, ch.c_out}, dt, kGpu),
                                Array::empty({ch.c_out}, dt, kGpu)};
        a.y = outs[0].raw_data();
        gpu->forward(a);
        a.bias = bd.raw_data();
        a.y = outs[1].raw_data();
        gpu->forward(a);
        a.dx = outs[2].raw_data();
        gpu->input_grad(a);
        a.dw = outs[3].raw_data();
        gpu->weight_grad(a);
        if (gpu->bias_grad) {
          a.dbias = outs[4].raw_data();
          gpu->bias_grad(a);
        }
        return outs;
      };
      const std::vector<Array> first = run(true);
      const std::vector<Array> second = run(true);
      const std::vector<Array> built_map = run(false);
      expect_close(first[0], y_ref, case_tol, "forward");
      expect_close(first[1], yb_ref, case_tol, "forward with bias");
      expect_close(first[2], dx_ref, case_tol, "input_grad");
      expect_close(first[3], dw_ref, case_tol, "weight_grad");
      if (gpu->bias_grad) expect_close(first[4], db_ref.to(Device::cpu()), dt == Dtype::f32 ? 1e-5 : case_tol, "bias_grad");
      const char* names[] = {"forward", "forward with bias", "input_grad", "weight_grad", "bias_grad"};
      for (std::size_t i = 0; i < first.size(); ++i) {
        if (i == 4 && !gpu->bias_grad) continue;
        EXPECT_TRUE(same_bytes(first[i], second[i])) << names[i] << ": repeated runs differ";
        EXPECT_TRUE(same_bytes(first[i], built_map[i])) << names[i] << ": gemm_map given vs built differ";
      }
    }
  }
}

TEST(CudaConv, GatherGemmScatterF32) {
  SKIP_UNLESS_RUNNABLE(RouteId::conv_cuda_gather_gemm_scatter);
  check_route(RouteId::conv_cuda_gather_gemm_scatter, Dtype::f32, false);
}
TEST(CudaConv, GatherGemmScatterF16) {
  SKIP_UNLESS_RUNNABLE(RouteId::conv_cuda_gather_gemm_scatter);
  check_route(RouteId::conv_cuda_gather_gemm_scatter, Dtype::f16, false);
}
TEST(CudaConv, GatherGemmScatterBF16) {
  SKIP_UNLESS_RUNNABLE(RouteId::conv_cuda_gather_gemm_scatter);
  check_route(RouteId::conv_cuda_gather_gemm_scatter, Dtype::bf16, false);
}
TEST(CudaConv, GatherGemmScatterTF32) {
  SKIP_UNLESS_RUNNABLE(RouteId::conv_cuda_gather_gemm_scatter);
  check_route(RouteId::conv_cuda_gather_gemm_scatter, Dtype::f32, true);
}
// The 1x1x1 identity relations cuda_pointwise_matmul takes (kernel volume 1 onto the input's own rows).
std::vector<Case> pointwise_cases() {
  std::vector<Case> out;
  auto x = random_set(400, 5, {1, 1, 1}, 17);
  out.push_back({"identity_400", x->relation(RelationKind::submanifold, spec_of(1, 1), nullptr, "test").relation});
  auto one = random_set(1, 2, {1, 1, 1}, 5);
  out.push_back({"identity_1", one->relation(RelationKind::submanifold, spec_of(1, 1), nullptr, "test").relation});
  auto none = CoordinateSet::create(Array::empty({0, 4}, Dtype::i32), {1, 1, 1});
  out.push_back({"identity_0", none->relation(RelationKind::submanifold, spec_of(1, 1), nullptr, "test").relation});
  for (const Case& c : out) EXPECT_TRUE(c.rel->identity) << c.name;
  return out;
}

TEST(CudaConv, PointwiseMatmulF32) {
  SKIP_UNLESS_RUNNABLE(RouteId::conv_cuda_pointwise_matmul);
  check_route(RouteId::conv_cuda_pointwise_matmul, Dtype::f32, false, {Channels{13, 21}, Channels{64, 64}, Channels{3, 1}},
              pointwise_cases());
}
TEST(CudaConv, PointwiseMatmulF16) {
  SKIP_UNLESS_RUNNABLE(RouteId::conv_cuda_pointwise_matmul);
  check_route(RouteId::conv_cuda_pointwise_matmul, Dtype::f16, false,
              {Channels{13, 21}, Channels{64, 64}, Channels{70, 130}}, pointwise_cases());
}
TEST(CudaConv, PointwiseMatmulBF16) {
  SKIP_UNLESS_RUNNABLE(RouteId::conv_cuda_pointwise_matmul);
  check_route(RouteId::conv_cuda_pointwise_matmul, Dtype::bf16, false, {Channels{13, 21}, Channels{64, 64}},
              pointwise_cases());
}
TEST(CudaConv, PointwiseMatmulTF32) {
  SKIP_UNLESS_RUNNABLE(RouteId::conv_cuda_pointwise_matmul);
  check_route(RouteId::conv_cuda_pointwise_matmul, Dtype::f32, true, {Channels{13, 21}, Channels{64, 64}},
              pointwise_cases());
}
// Pointers one element past an allocation (not 16-byte aligned): cuBLAS takes any element alignment.
TEST(CudaConv, PointwiseMatmulUnaligned) {
  SKIP_UNLESS_RUNNABLE(RouteId::conv_cuda_pointwise_matmul);
  check_route(RouteId::conv_cuda_pointwise_matmul, Dtype::f16, false, {Channels{64, 64}, Channels{16, 72}},
              pointwise_cases(), 1);
}

TEST(CudaConv, ImplicitGemmSm80F16) {
  SKIP_UNLESS_RUNNABLE(RouteId::conv_implicit_gemm_sm80);
  check_route(RouteId::conv_implicit_gemm_sm80, Dtype::f16, false);
}
TEST(CudaConv, ImplicitGemmSm80BF16) {
  SKIP_UNLESS_RUNNABLE(RouteId::conv_implicit_gemm_sm80);
  check_route(RouteId::conv_implicit_gemm_sm80, Dtype::bf16, false);
}
TEST(CudaConv, ImplicitGemmSm80TF32) {
  SKIP_UNLESS_RUNNABLE(RouteId::conv_implicit_gemm_sm80);
  check_route(RouteId::conv_implicit_gemm_sm80, Dtype::f32, true);
}

// Admission: which CUDA routes take which problems (no device needed).
// implicit_gemm_sm80 fast paths and their fallbacks: channel counts that are multiples of 8
// (16-byte copies for f16/bf16; f32 needs multiples of 4) or not, C_out and C_in above one 64-wide
// tile, a relation large enough for several row tiles and a split weight gradient (more than
// 1024 edges per offset on average), and unaligned source / weight pointers (element path).
std::vector<Channels> implicit_gemm_channels() {
  return {Channels{8, 8},  Channels{16, 136}, Channels{136, 72}, Channels{32, 12},
          Channels{12, 32}, Channels{64, 64},  Channels{4, 20},   Channels{24, 200}};
}
std::vector<Case> implicit_gemm_cases() {
  std::vector<Case> out = cases();
  auto dense = random_set(6000, 10, {1, 1, 1}, 21);  // ~1/3 of 2 x 21^3 cells: many edges per offset
  out.push_back({"dense_subm_k3", dense->relation(RelationKind::submanifold, spec_of(3, 1), nullptr, "test").relation});
  return out;
}
TEST(CudaConv, ImplicitGemmSm80FastPathsF16) {
  SKIP_UNLESS_RUNNABLE(RouteId::conv_implicit_gemm_sm80);
  check_route(RouteId::conv_implicit_gemm_sm80, Dtype::f16, false, implicit_gemm_channels(), implicit_gemm_cases());
}
TEST(CudaConv, ImplicitGemmSm80FastPathsBF16) {
  SKIP_UNLESS_RUNNABLE(RouteId::conv_implicit_gemm_sm80);
  check_route(RouteId::conv_implicit_gemm_sm80, Dtype::bf16, false, implicit_gemm_channels(),
              implicit_gemm_cases());
}
TEST(CudaConv, ImplicitGemmSm80FastPathsTF32) {
  SKIP_UNLESS_RUNNABLE(RouteId::conv_implicit_gemm_sm80);
  check_route(RouteId::conv_implicit_gemm_sm80, Dtype::f32, true, implicit_gemm_channels(), implicit_gemm_cases());
}
TEST(CudaConv, ImplicitGemmSm80Unaligned) {
  SKIP_UNLESS_RUNNABLE(RouteId::conv_implicit_gemm_sm80);
  // Pointers one element past a 16-byte boundary: channel counts allow vectors, alignment does not.
  check_route(RouteId::conv_implicit_gemm_sm80, Dtype::f16, false, {Channels{64, 64}, Channels{16, 72}},
              implicit_gemm_cases(), 1);
  check_route(RouteId::conv_implicit_gemm_sm80, Dtype::f32, true, {Channels{32, 8}}, cases(), 1);
}

// The lean stage-copy path of implicit_gemm_sm80 (LATTICE_IGEMM_LEAN=1; off by default until a GPU
// run has timed it): the same parity checks as the fast-path tests, and the same bits as the general
// path for the forward and the input gradient (the copies are the same; only their addressing
// differs). Sets the variable for the test's duration and restores what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_)
      ::setenv(name_, old_.c_str(), 1);
    else
      ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

// Forward (with bias) and input gradient of `id` on every case and channel pair, with
// LATTICE_IGEMM_LEAN set to `lean`.
std::vector<Array> implicit_gemm_outputs(Dtype dt, bool allow_tf32, const char* lean,
                                         const std::vector<Channels>& channels, const std::vector<Case>& case_list) {
  const ScopedEnv env("LATTICE_IGEMM_LEAN", lean);
  const ConvKernels* gpu = backend::find_conv_kernels(RouteId::conv_implicit_gemm_sm80);
  std::vector<Array> outs;
  std::mt19937 rng(99);
  for (const Case& c : case_list) {
    const Relation& r = *c.rel;
    const Views dev = views_on(r, kGpu);
    for (const Channels ch : channels) {
      const Array x = random_array({r.n_in, ch.c_in}, dt, rng).to(kGpu);
      const Array w = random_array({r.kernel_volume, ch.c_in, ch.c_out}, dt, rng).to(kGpu);
      const Array bias = random_array({ch.c_out}, dt, rng).to(kGpu);
      const Array dy = random_array({r.n_out, ch.c_out}, dt, rng).to(kGpu);
      ConvArgs a = conv_args(dt, dev.view(r, true), ch, x.raw_data(), w.raw_data(), dy.raw_data(), kGpu, allow_tf32);
      a.bias = bias.raw_data();
      outs.push_back(Array::empty({r.n_out, ch.c_out}, dt, kGpu));
      a.y = outs.back().raw_data();
      gpu->forward(a);
      outs.push_back(Array::empty({r.n_in, ch.c_in}, dt, kGpu));
      a.dx = outs.back().raw_data();
      gpu->input_grad(a);
    }
  }
  return outs;
}

void check_lean(Dtype dt, bool allow_tf32) {
  const std::vector<Channels> channels = implicit_gemm_channels();
  std::vector<Case> case_list = implicit_gemm_cases();
  // A full 12^3 block (~23 of 27 offsets per row): the 128-row tiles.
  std::vector<std::int32_t> cube;
  for (std::int32_t i = 0; i < 12; ++i)
    for (std::int32_t j = 0; j < 12; ++j)
      for (std::int32_t k = 0; k < 12; ++k) cube.insert(cube.end(), {0, i, j, k});
  auto block = CoordinateSet::create(Array::from_vector<std::int32_t>(cube, {12 * 12 * 12, 4}), {1, 1, 1});
  case_list.push_back(
      {"full_block_k3", block->relation(RelationKind::submanifold, spec_of(3, 1), nullptr, "test").relation});
  {
    const ScopedEnv env("LATTICE_IGEMM_LEAN", "1");
    check_route(RouteId::conv_implicit_gemm_sm80, dt, allow_tf32, channels, case_list);
  }
  const std::vector<Array> lean = implicit_gemm_outputs(dt, allow_tf32, "1", channels, case_list);
  const std::vector<Array> general = implicit_gemm_outputs(dt, allow_tf32, "0", channels, case_list);
  ASSERT_EQ(lean.size(), general.size());
  for (std::size_t i = 0; i < lean.size(); ++i)
    EXPECT_TRUE(same_bytes(lean[i], general[i])) << "output " << i << " (" << (i % 2 ? "input_grad" : "forward")
                                                 << "): the lean and general paths differ";
}

TEST(CudaConv, ImplicitGemmSm80LeanF16) {
  SKIP_UNLESS_RUNNABLE(RouteId::conv_implicit_gemm_sm80);
  check_lean(Dtype::f16, false);
}
TEST(CudaConv, ImplicitGemmSm80LeanBF16) {
  SKIP_UNLESS_RUNNABLE(RouteId::conv_implicit_gemm_sm80);
  check_lean(Dtype::bf16, false);
}
TEST(CudaConv, ImplicitGemmSm80LeanTF32) {
  SKIP_UNLESS_RUNNABLE(RouteId::conv_implicit_gemm_sm80);
  check_lean(Dtype::f32, true);
}

// Small enough to finish under compute-sanitizer --tool racecheck in seconds (the other tests take
// minutes there): one 400-row submanifold relation, every pass, the cp.async vector path
// (channels multiple of 8 halves) and the element path, f16 and tf32.
TEST(CudaConv, ImplicitGemmSm80RacecheckSmall) {
  SKIP_UNLESS_RUNNABLE(RouteId::conv_implicit_gemm_sm80);
  const std::vector<Case> one{cases().front()};
  check_route(RouteId::conv_implicit_gemm_sm80, Dtype::f16, false, {Channels{32, 32}, Channels{12, 20}}, one);
  check_route(RouteId::conv_implicit_gemm_sm80, Dtype::f32, true, {Channels{16, 8}}, one);
}

TEST(CudaConv, AdmissionRows) {
  DeviceCaps caps;
  caps.cuda.built = true;
  caps.cuda.device_count = 1;
  caps.cuda.sm = 90;
  caps.cuda.tier = GpuTier::hopper;
  caps.cuda.status = "ok";
  ConvProblem p;
  p.device = kGpu;
  p.kernel_volume = 27;
  auto chosen = [&](Dtype dt, bool tf32) {
    p.dtype = dt;
    p.allow_tf32 = tf32;
    return explain(p, caps, RoutePolicy{}).chosen;
  };
  EXPECT_EQ(chosen(Dtype::f16, false), RouteId::conv_implicit_gemm_sm80);
  EXPECT_EQ(chosen(Dtype::bf16, false), RouteId::conv_implicit_gemm_sm80);
  EXPECT_EQ(chosen(Dtype::f32, false), RouteId::conv_cuda_gather_gemm_scatter);
  EXPECT_EQ(chosen(Dtype::f32, true), RouteId::conv_implicit_gemm_sm80);
  EXPECT_FALSE(chosen(Dtype::f64, false).has_value());
  caps.cuda.sm = 75;
  caps.cuda.tier = GpuTier::classic;
  EXPECT_EQ(chosen(Dtype::f16, false), RouteId::conv_cuda_gather_gemm_scatter);
  p.device = Device::cpu();
  p.dtype = Dtype::f16;
  const Explanation e = explain(p, caps, RoutePolicy{});
  ASSERT_NE(e.row(RouteId::conv_cuda_gather_gemm_scatter), nullptr);
  EXPECT_FALSE(e.row(RouteId::conv_cuda_gather_gemm_scatter)->verdict.admitted);
  EXPECT_FALSE(e.row(RouteId::conv_implicit_gemm_sm80)->verdict.admitted);
}

}  // namespace
}  // namespace lattice
