// Sparse algebra and coordinate utilities on a CUDA device (src/backend/cuda/algebra/hashed.cu,
// src/backend/cuda/coords/utilities.cu): every CUDA route result must be bitwise equal to the
// CPU reference route on the same inputs (row maps, coordinates, features and gradients in f16,
// bf16, f32, f64, codes, orders, kept rows, counts), on random inputs with negative coordinates,
// several batches, empty inputs and duplicates where the op allows them; two runs of a CUDA route
// must give the same bits; errors (repeated rows, mixed devices) must read as on the CPU.
// The route-level tests call the kernel table directly (no coordinate set on the device needed);
// the op-level tests go through lattice::ops with cuda arrays.
// Skipped, with the reason printed, when no CUDA device is available.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backend/args.h"
#include "backend/kernel_table.h"
#include "cuda_test_support.h"
#include "lattice/core/array.h"
#include "lattice/core/error.h"
#include "lattice/ops/algebra.h"
#include "lattice/ops/coords.h"
#include "lattice/route/route.h"
#include "lattice/tensor/coordinate_set.h"

namespace lattice {
namespace {

using Row = std::array<std::int32_t, 4>;

using cuda_test::kGpu;

const backend::AlgebraKernels& cpu_algebra() { return *backend::find_algebra_kernels(RouteId::algebra_reference); }
const backend::AlgebraKernels& gpu_algebra() {
  const backend::AlgebraKernels* k = backend::find_algebra_kernels(RouteId::algebra_cuda_hashed);
  EXPECT_NE(k, nullptr) << "cuda_hashed has no kernels in a CUDA build";
  return *k;
}
const backend::CoordsKernels& cpu_coords() { return *backend::find_coords_kernels(RouteId::coords_reference); }
const backend::CoordsKernels& gpu_coords() {
  const backend::CoordsKernels* k = backend::find_coords_kernels(RouteId::coords_cuda);
  EXPECT_NE(k, nullptr) << "coords cuda has no kernels in a CUDA build";
  return *k;
}

Array rows_array(const std::vector<Row>& rows) {
  std::vector<std::int32_t> flat;
  for (const Row& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  return Array::from_vector<std::int32_t>(flat, {static_cast<std::int64_t>(rows.size()), 4});
}

// n rows, batch ids in [0, batches), x, y, z in [-range, range]; unique unless `repeats`.
std::vector<Row> random_rows(std::int64_t n, std::int32_t batches, std::int32_t range, std::uint32_t seed,
                             bool repeats = false) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<std::int32_t> coord(-range, range);
  std::uniform_int_distribution<std::int32_t> batch(0, batches - 1);
  std::set<Row> seen;
  std::vector<Row> rows;
  while (static_cast<std::int64_t>(rows.size()) < n) {
    const Row r{batch(gen), coord(gen), coord(gen), coord(gen)};
    if (repeats || seen.insert(r).second) rows.push_back(r);
  }
  return rows;
}

// Two sets sharing about half their rows (shuffled), both unique.
std::pair<std::vector<Row>, std::vector<Row>> overlapping(std::int64_t n_lhs, std::int64_t n_rhs, std::uint32_t seed) {
  std::vector<Row> pool = random_rows(n_lhs + n_rhs, 3, 40, seed);
  std::mt19937 gen(seed + 1);
  std::vector<Row> lhs(pool.begin(), pool.begin() + n_lhs);
  std::vector<Row> rhs;
  for (std::int64_t j = 0; j < n_rhs; ++j) {
    const bool shared = n_lhs > 0 && (gen() % 2 == 0);
    rhs.push_back(shared ? lhs[gen() % n_lhs] : pool[n_lhs + j]);
  }
  // Repeated picks of one shared row would make rhs non-unique: drop repeats, keep order.
  std::set<Row> seen;
  std::vector<Row> unique_rhs;
  for (const Row& r : rhs)
    if (seen.insert(r).second) unique_rhs.push_back(r);
  std::shuffle(unique_rhs.begin(), unique_rhs.end(), gen);
  return {lhs, unique_rhs};
}

// Element i of a host array: its value and its bits (so NaN payloads and signed zeros show).
std::string describe(const void* base, Dtype dtype, std::int64_t i) {
  const std::size_t es = size_of(dtype);
  const char* p = static_cast<const char*>(base) + static_cast<std::size_t>(i) * es;
  std::uint64_t bits = 0;
  std::memcpy(&bits, p, es);
  std::string value;
  switch (dtype) {
    case Dtype::f16: { Half h; std::memcpy(&h, p, es); value = std::to_string(to_float(h)); break; }
    case Dtype::bf16: { BFloat16 b; std::memcpy(&b, p, es); value = std::to_string(to_float(b)); break; }
    case Dtype::f32: { float f; std::memcpy(&f, p, es); value = std::to_string(f); break; }
    case Dtype::f64: { double d; std::memcpy(&d, p, es); value = std::to_string(d); break; }
    case Dtype::i32: { std::int32_t v; std::memcpy(&v, p, es); value = std::to_string(v); break; }
    case Dtype::i64: { std::int64_t v; std::memcpy(&v, p, es); value = std::to_string(v); break; }
    default: value = "?"; break;
  }
  char hex[32];
  std::snprintf(hex, sizeof hex, "0x%llx", static_cast<unsigned long long>(bits));
  return value + " (bits " + hex + ")";
}

// `gpu` lives on cuda:0 and equals `cpu` bit for bit (dtype, shape and bytes).
void expect_same_array(const Array& cpu, const Array& gpu, const std::string& what) {
  ASSERT_TRUE(cpu.defined()) << what;
  ASSERT_TRUE(gpu.defined()) << what;
  EXPECT_EQ(gpu.device(), kGpu) << what;
  ASSERT_EQ(gpu.dtype(), cpu.dtype()) << what;
  ASSERT_EQ(gpu.shape(), cpu.shape()) << what;
  const Array back = gpu.to(Device::cpu());
  const Array want = cpu.contiguous();
  ASSERT_EQ(back.nbytes(), want.nbytes()) << what;
  if (want.nbytes() == 0) return;
  const std::size_t es = size_of(want.dtype());
  std::int64_t first = -1, count = 0;
  std::string shown;
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    if (std::memcmp(static_cast<const char*>(back.raw_data()) + i * es,
                    static_cast<const char*>(want.raw_data()) + i * es, es) != 0) {
      if (first < 0) first = i;
      if (++count <= 4)
        shown += "\n  element " + std::to_string(i) + ": cpu " + describe(want.raw_data(), want.dtype(), i) +
                 ", cuda " + describe(back.raw_data(), back.dtype(), i);
    }
  }
  if (count > 0)
    ADD_FAILURE() << what << ": element " << first << " of " << want.numel() << " differs (" << count
                  << " elements differ; the first ones:" << shown << ")";
}

// Two device arrays with identical bytes (determinism).
void expect_same_bits(const Array& a, const Array& b, const std::string& what) {
  expect_same_array(a.to(Device::cpu()), b, what + " (second run)");
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

// ---- alignment and lookup (route level) ---------------------------------------------------------

backend::AlignArgs align_args(Join join, const Array& lhs, const Array& rhs) {
  backend::AlignArgs a;
  a.join = join;
  a.n_lhs = lhs.dim(0);
  a.n_rhs = rhs.dim(0);
  a.lhs = lhs.data<std::int32_t>();
  a.rhs = rhs.data<std::int32_t>();
  a.device = lhs.device();
  a.op = "sparse_add";
  return a;
}

TEST(CudaAlgebra, AlignMatchesTheReferenceOnEveryJoinAndSize) {
  LATTICE_REQUIRE_CUDA();
  const std::vector<std::pair<std::int64_t, std::int64_t>> sizes = {
      {0, 0}, {0, 5}, {7, 0}, {1, 1}, {200, 300}, {5000, 4000}, {20000, 3}};
  std::uint32_t seed = 1;
  for (const auto& [nl, nr] : sizes) {
    const auto [l, r] = overlapping(nl, nr, seed++);
    const Array lhs = rows_array(l), rhs = rows_array(r);
    const Array glhs = lhs.to(kGpu), grhs = rhs.to(kGpu);
    for (Join join : {Join::inner, Join::left, Join::right, Join::outer}) {
      const std::string what = std::string(to_string(join)) + " " + std::to_string(nl) + "x" + std::to_string(nr);
      const backend::AlignResult want = cpu_algebra().align(align_args(join, lhs, rhs));
      const backend::AlignResult got = gpu_algebra().align(align_args(join, glhs, grhs));
      expect_same_array(want.lhs_rows, got.lhs_rows, what + " lhs_rows");
      expect_same_array(want.rhs_rows, got.rhs_rows, what + " rhs_rows");
      expect_same_array(want.coords, got.coords, what + " coords");
      const backend::AlignResult again = gpu_algebra().align(align_args(join, glhs, grhs));
      expect_same_bits(got.lhs_rows, again.lhs_rows, what + " lhs_rows");
      expect_same_bits(got.rhs_rows, again.rhs_rows, what + " rhs_rows");
      expect_same_bits(got.coords, again.coords, what + " coords");
    }
  }
}

TEST(CudaAlgebra, LookupMatchesTheReferenceWithRepeatedAndMissingQueries) {
  LATTICE_REQUIRE_CUDA();
  for (const auto& [n_table, n_queries] : std::vector<std::pair<std::int64_t, std::int64_t>>{
           {0, 4}, {5, 0}, {300, 1000}, {10000, 10000}}) {
    const std::vector<Row> table = random_rows(n_table, 4, 30, 11);
    std::vector<Row> queries = random_rows(n_queries, 4, 30, 12, /*repeats=*/true);
    for (std::size_t q = 0; q < queries.size() && n_table > 0; q += 3) queries[q] = table[q % table.size()];
    const Array t = rows_array(table), qa = rows_array(queries);
    const Array gt = t.to(kGpu), gq = qa.to(kGpu);
    Array want = Array::empty({n_queries}, Dtype::i64);
    Array got = Array::empty({n_queries}, Dtype::i64, kGpu);
    Array again = Array::empty({n_queries}, Dtype::i64, kGpu);
    auto args = [&](const Array& tab, const Array& que, const Array& out) {
      backend::LookupArgs a;
      a.n_table = tab.dim(0);
      a.n_queries = que.dim(0);
      a.table = tab.data<std::int32_t>();
      a.queries = que.data<std::int32_t>();
      a.rows = out.data<std::int64_t>();
      a.device = tab.device();
      a.op = "lookup_coords";
      return a;
    };
    cpu_algebra().lookup(args(t, qa, want));
    gpu_algebra().lookup(args(gt, gq, got));
    gpu_algebra().lookup(args(gt, gq, again));
    const std::string what = "lookup " + std::to_string(n_table) + "x" + std::to_string(n_queries);
    expect_same_array(want, got, what);
    expect_same_bits(got, again, what);
  }
}

TEST(CudaAlgebra, RepeatedRowsRaiseTheCpuIndexError) {
  LATTICE_REQUIRE_CUDA();
  const std::vector<Row> dup = {{0, 1, 2, 3}, {1, -4, 5, 6}, {0, 0, 0, 0}, {1, -4, 5, 6}, {1, -4, 5, 6}};
  const std::vector<Row> ok = {{0, 1, 2, 3}};
  // The CPU path: building the index of the repeated set raises.
  const auto cpu_dup = CoordinateSet::create(rows_array(dup), {1, 1, 1});
  const auto cpu_ok = CoordinateSet::create(rows_array(ok), {1, 1, 1});
  const std::string want = message_of([&] { ops::align("sparse_add", cpu_ok, cpu_dup, Join::outer); });
  EXPECT_EQ(want, "[sparse_add] coords: expected unique rows, got row 3 (1, -4, 5, 6) equal to row 1");
  const Array gdup = rows_array(dup).to(kGpu), gok = rows_array(ok).to(kGpu);
  EXPECT_EQ(message_of([&] { gpu_algebra().align(align_args(Join::outer, gok, gdup)); }), want);
  EXPECT_EQ(message_of([&] { gpu_algebra().align(align_args(Join::inner, gdup, gok)); }), want);
  Array rows = Array::empty({1}, Dtype::i64, kGpu);
  backend::LookupArgs a;
  a.n_table = gdup.dim(0);
  a.n_queries = 1;
  a.table = gdup.data<std::int32_t>();
  a.queries = gok.data<std::int32_t>();
  a.rows = rows.data<std::int64_t>();
  a.device = kGpu;
  a.op = "sparse_add";
  EXPECT_EQ(message_of([&] { gpu_algebra().lookup(a); }), want);
}

// ---- combine (route level) -------------------------------------------------------------------------

// Random (n, c) features of `dtype` on the host: small integers and halves (so that maximum /
// minimum see ties), a few NaNs and signed zeros.
Array random_feats(std::int64_t n, std::int64_t c, Dtype dtype, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> v(-6, 6);
  std::vector<float> values(static_cast<std::size_t>(n * c));
  for (float& x : values) {
    const int r = v(gen);
    x = r == 6 ? std::numeric_limits<float>::quiet_NaN() : (r == 5 ? -0.0f : 0.5f * static_cast<float>(r) + 0.1f * (gen() % 3));
  }
  Array out = Array::empty({n, c}, dtype);
  for (std::size_t i = 0; i < values.size(); ++i) {
    switch (dtype) {
      case Dtype::f16: out.data<Half>()[i] = to_half(values[i]); break;
      case Dtype::bf16: out.data<BFloat16>()[i] = to_bfloat16(values[i]); break;
      case Dtype::f32: out.data<float>()[i] = values[i]; break;
      default: out.data<double>()[i] = static_cast<double>(values[i]) / 3.0; break;
    }
  }
  return out;
}

TEST(CudaAlgebra, CombineForwardAndBackwardMatchTheReferenceBitwise) {
  LATTICE_REQUIRE_CUDA();
  const auto [l, r] = overlapping(700, 900, 21);
  const Array lhs_c = rows_array(l), rhs_c = rows_array(r);
  const std::int64_t nl = lhs_c.dim(0), nr = rhs_c.dim(0);
  std::uint32_t seed = 100;
  for (Dtype dtype : {Dtype::f32, Dtype::f64, Dtype::f16, Dtype::bf16}) {
    for (Join join : {Join::inner, Join::left, Join::right, Join::outer}) {
      const backend::AlignResult al = cpu_algebra().align(align_args(join, lhs_c, rhs_c));
      const Array g_lrows = al.lhs_rows.to(kGpu), g_rrows = al.rhs_rows.to(kGpu);
      const std::int64_t m = al.lhs_rows.dim(0);
      for (AlgebraOp op : {AlgebraOp::add, AlgebraOp::sub, AlgebraOp::mul, AlgebraOp::maximum,
                           AlgebraOp::minimum, AlgebraOp::cat}) {
        for (double fill : {0.0, -1.5, 0.3}) {
          const std::int64_t cl = op == AlgebraOp::cat ? 2 : 5, cr = op == AlgebraOp::cat ? 3 : 5;
          const std::int64_t c_out = op == AlgebraOp::cat ? cl + cr : cl;
          const Array lf = random_feats(nl, cl, dtype, seed++), rf = random_feats(nr, cr, dtype, seed++);
          const Array dout = random_feats(m, c_out, dtype, seed++);
          const Array glf = lf.to(kGpu), grf = rf.to(kGpu), gdout = dout.to(kGpu);
          const std::string what = std::string(to_string(dtype)) + " " + std::string(to_string(join)) + " op " +
                                   std::to_string(static_cast<int>(op)) + " fill " + std::to_string(fill);
          auto args = [&](bool gpu) {
            backend::CombineArgs a;
            a.op = op;
            a.dtype = dtype;
            a.n_out = m;
            a.n_lhs = nl;
            a.n_rhs = nr;
            a.c_lhs = cl;
            a.c_rhs = cr;
            a.lhs_rows = (gpu ? g_lrows : al.lhs_rows).data<std::int64_t>();
            a.rhs_rows = (gpu ? g_rrows : al.rhs_rows).data<std::int64_t>();
            a.fill = fill;
            a.lhs = (gpu ? glf : lf).raw_data();
            a.rhs = (gpu ? grf : rf).raw_data();
            a.dout = (gpu ? gdout : dout).raw_data();
            a.device = gpu ? kGpu : Device::cpu();
            return a;
          };
          Array want = Array::empty({m, c_out}, dtype);
          Array got = Array::empty({m, c_out}, dtype, kGpu);
          Array again = Array::empty({m, c_out}, dtype, kGpu);
          backend::CombineArgs a = args(false);
          a.out = want.raw_data();
          cpu_algebra().forward(a);
          a = args(true);
          a.out = got.raw_data();
          gpu_algebra().forward(a);
          a.out = again.raw_data();
          gpu_algebra().forward(a);
          expect_same_array(want, got, what + " forward");
          expect_same_bits(got, again, what + " forward");

          Array wl = Array::empty({nl, cl}, dtype), wr = Array::empty({nr, cr}, dtype);
          Array gl = Array::empty({nl, cl}, dtype, kGpu), gr = Array::empty({nr, cr}, dtype, kGpu);
          a = args(false);
          a.dlhs = wl.raw_data();
          a.drhs = wr.raw_data();
          cpu_algebra().backward(a);
          a = args(true);
          a.dlhs = gl.raw_data();
          a.drhs = gr.raw_data();
          gpu_algebra().backward(a);
          expect_same_array(wl, gl, what + " dlhs");
          expect_same_array(wr, gr, what + " drhs");
          // One side only.
          Array gl_only = Array::empty({nl, cl}, dtype, kGpu);
          a.dlhs = gl_only.raw_data();
          a.drhs = nullptr;
          gpu_algebra().backward(a);
          expect_same_array(wl, gl_only, what + " dlhs only");
        }
      }
    }
  }
}

TEST(CudaAlgebra, CombineOnIdentityMapsAndEmptyOutputs) {
  LATTICE_REQUIRE_CUDA();
  for (std::int64_t n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{333}}) {
    for (AlgebraOp op : {AlgebraOp::add, AlgebraOp::maximum, AlgebraOp::cat}) {
      const std::int64_t c = 4, c_out = op == AlgebraOp::cat ? 8 : 4;
      const Array lf = random_feats(n, c, Dtype::f32, 7), rf = random_feats(n, c, Dtype::f32, 8);
      const Array dout = random_feats(n, c_out, Dtype::f32, 9);
      const Array glf = lf.to(kGpu), grf = rf.to(kGpu), gdout = dout.to(kGpu);
      auto args = [&](bool gpu) {
        backend::CombineArgs a;
        a.op = op;
        a.dtype = Dtype::f32;
        a.n_out = a.n_lhs = a.n_rhs = n;
        a.c_lhs = a.c_rhs = c;
        a.lhs = (gpu ? glf : lf).raw_data();
        a.rhs = (gpu ? grf : rf).raw_data();
        a.dout = (gpu ? gdout : dout).raw_data();
        a.device = gpu ? kGpu : Device::cpu();
        return a;
      };
      Array want = Array::empty({n, c_out}, Dtype::f32), got = Array::empty({n, c_out}, Dtype::f32, kGpu);
      backend::CombineArgs a = args(false);
      a.out = want.raw_data();
      cpu_algebra().forward(a);
      a = args(true);
      a.out = got.raw_data();
      gpu_algebra().forward(a);
      const std::string what = "identity n=" + std::to_string(n) + " op " + std::to_string(static_cast<int>(op));
      expect_same_array(want, got, what);
      Array wl = Array::empty({n, c}, Dtype::f32), wr = Array::empty({n, c}, Dtype::f32);
      Array gl = Array::empty({n, c}, Dtype::f32, kGpu), gr = Array::empty({n, c}, Dtype::f32, kGpu);
      a = args(false);
      a.dlhs = wl.raw_data();
      a.drhs = wr.raw_data();
      cpu_algebra().backward(a);
      a = args(true);
      a.dlhs = gl.raw_data();
      a.drhs = gr.raw_data();
      gpu_algebra().backward(a);
      expect_same_array(wl, gl, what + " dlhs");
      expect_same_array(wr, gr, what + " drhs");
    }
  }
}

// ---- coordinate utilities (route level) --------------------------------------------------------

TEST(CudaCoords, DownsampleMatchesTheReferenceWithRepeatsAndNegatives) {
  LATTICE_REQUIRE_CUDA();
  for (std::int64_t n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{1000}, std::int64_t{50000}}) {
    for (Int3 stride : {Int3{1, 1, 1}, Int3{2, 2, 2}, Int3{2, 3, 5}}) {
      const Array c = rows_array(random_rows(n, 3, 25, 31, /*repeats=*/true));
      const Array gc = c.to(kGpu);
      backend::DownsampleArgs a;
      a.n = n;
      a.coords = c.data<std::int32_t>();
      a.stride = stride;
      const backend::DownsampleResult want = cpu_coords().downsample(a);
      a.coords = gc.data<std::int32_t>();
      a.device = kGpu;
      const backend::DownsampleResult got = gpu_coords().downsample(a);
      const backend::DownsampleResult again = gpu_coords().downsample(a);
      const std::string what = "downsample n=" + std::to_string(n) + " stride " + to_string(stride);
      expect_same_array(want.coords, got.coords, what + " coords");
      expect_same_array(want.inverse, got.inverse, what + " inverse");
      expect_same_bits(got.coords, again.coords, what + " coords");
      expect_same_bits(got.inverse, again.inverse, what + " inverse");
    }
  }
}

TEST(CudaCoords, MortonCodesAndStableOrderMatchTheReference) {
  LATTICE_REQUIRE_CUDA();
  const std::int32_t lim = (1 << 20) - 1;
  for (std::int64_t cols : {std::int64_t{3}, std::int64_t{4}}) {
    for (std::int64_t n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{777}, std::int64_t{40000}}) {
      // Repeated rows (equal codes: ties keep the input order), negative batches and values.
      std::vector<Row> rows = random_rows(n, 4, 6, 41, /*repeats=*/true);
      std::mt19937 gen(42);
      for (std::size_t i = 0; i < rows.size(); i += 7) {
        rows[i][0] -= 2;
        rows[i][1] = (i % 2) ? lim : -lim - 1;
      }
      std::vector<std::int32_t> flat;
      for (const Row& r : rows)
        for (std::int64_t k = 4 - cols; k < 4; ++k) flat.push_back(r[k]);
      const Array c = Array::from_vector<std::int32_t>(flat, {n, cols});
      const Array gc = c.to(kGpu);
      Array wc = Array::empty({n}, Dtype::i64), wo = Array::empty({n}, Dtype::i64);
      Array gcodes = Array::empty({n}, Dtype::i64, kGpu), gorder = Array::empty({n}, Dtype::i64, kGpu);
      Array gorder2 = Array::empty({n}, Dtype::i64, kGpu);
      backend::MortonArgs a;
      a.n = n;
      a.cols = cols;
      a.coords = c.data<std::int32_t>();
      a.codes = wc.data<std::int64_t>();
      a.order = wo.data<std::int64_t>();
      cpu_coords().morton(a);
      a.coords = gc.data<std::int32_t>();
      a.device = kGpu;
      a.codes = gcodes.data<std::int64_t>();
      a.order = nullptr;
      gpu_coords().morton(a);
      a.codes = nullptr;
      a.order = gorder.data<std::int64_t>();
      gpu_coords().morton(a);
      a.order = gorder2.data<std::int64_t>();
      gpu_coords().morton(a);
      const std::string what = "morton cols=" + std::to_string(cols) + " n=" + std::to_string(n);
      expect_same_array(wc, gcodes, what + " codes");
      expect_same_array(wo, gorder, what + " order");
      expect_same_bits(gorder, gorder2, what + " order");
    }
  }
}

TEST(CudaCoords, PruneCropDenseAndCollateMatchTheReference) {
  LATTICE_REQUIRE_CUDA();
  for (std::int64_t n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{5000}}) {
    const Array c = rows_array(random_rows(n, 3, 10, 51, true));
    const Array gc = c.to(kGpu);
    std::mt19937 gen(52);
    Array mask = Array::empty({n}, Dtype::u8);
    for (std::int64_t i = 0; i < n; ++i) mask.data<std::uint8_t>()[i] = static_cast<std::uint8_t>(gen() % 3 == 0);
    const Array gmask = mask.to(kGpu);
    backend::SelectArgs prune;
    prune.n = n;
    prune.mask = mask.data<std::uint8_t>();
    const Array want_p = cpu_coords().select(prune);
    prune.mask = gmask.data<std::uint8_t>();
    prune.device = kGpu;
    expect_same_array(want_p, gpu_coords().select(prune), "prune n=" + std::to_string(n));
    backend::SelectArgs crop;
    crop.n = n;
    crop.coords = c.data<std::int32_t>();
    crop.lo = {-3, -10, 0};
    crop.hi = {4, 2, 11};
    const Array want_c = cpu_coords().select(crop);
    crop.coords = gc.data<std::int32_t>();
    crop.device = kGpu;
    expect_same_array(want_c, gpu_coords().select(crop), "crop n=" + std::to_string(n));

    // dense: rows shifted into the grid [origin, origin + size).
    backend::DenseIndexArgs d;
    d.n = n;
    d.coords = c.data<std::int32_t>();
    d.origin = {-10, -10, -10};
    d.size = {21, 21, 21};
    Array want_d = Array::empty({n}, Dtype::i64), got_d = Array::empty({n}, Dtype::i64, kGpu);
    d.index = want_d.data<std::int64_t>();
    cpu_coords().dense_index(d);
    d.coords = gc.data<std::int32_t>();
    d.index = got_d.data<std::int64_t>();
    d.device = kGpu;
    gpu_coords().dense_index(d);
    expect_same_array(want_d, got_d, "dense n=" + std::to_string(n));
  }
  // collate: mixed widths, an empty sample, negative values.
  const Array s0 = rows_array(random_rows(300, 2, 9, 61, true));
  const Array s1 = Array::empty({0, 4}, Dtype::i32);
  std::vector<std::int32_t> flat3;
  for (const Row& r : random_rows(120, 1, 9, 62, true)) flat3.insert(flat3.end(), r.begin() + 1, r.end());
  const Array s2 = Array::from_vector<std::int32_t>(flat3, {120, 3});
  std::vector<backend::CollateSample> host, dev;
  std::vector<Array> held;
  for (const Array& s : {s0, s1, s2}) {
    held.push_back(s.to(kGpu));
    host.push_back({s.dim(0), s.dim(1), s.data<std::int32_t>(), Device::cpu()});
    dev.push_back({s.dim(0), s.dim(1), held.back().data<std::int32_t>(), kGpu});
  }
  const backend::CollateResult want = cpu_coords().collate(host);
  const backend::CollateResult got = gpu_coords().collate(dev);
  expect_same_array(want.coords, got.coords, "collate coords");
  EXPECT_EQ(want.counts, got.counts);
}

TEST(CudaCoords, NonzeroMatchesTheReference) {
  LATTICE_REQUIRE_CUDA();
  const std::vector<std::pair<std::int64_t, std::array<std::int64_t, 3>>> grids = {
      {0, {3, 3, 3}}, {2, {0, 4, 4}}, {1, {1, 1, 1}}, {3, {5, 6, 7}}, {2, {64, 32, 48}}};
  for (const auto& [batch, size] : grids) {
    const std::int64_t cells = batch * size[0] * size[1] * size[2];
    Array site = Array::empty({cells}, Dtype::u8);
    std::mt19937 gen(71);
    for (std::int64_t f = 0; f < cells; ++f) site.data<std::uint8_t>()[f] = static_cast<std::uint8_t>(gen() % 5 == 0 ? 1 : 0);
    if (batch == 3)  // an all-empty batch in the middle
      for (std::int64_t f = cells / 3; f < 2 * cells / 3; ++f) site.data<std::uint8_t>()[f] = 0;
    const Array gsite = site.to(kGpu);
    backend::NonzeroArgs a;
    a.batch = batch;
    a.size = size;
    a.site = site.data<std::uint8_t>();
    a.origin = {-2, 5, -7};
    const backend::NonzeroResult want = cpu_coords().nonzero(a);
    a.site = gsite.data<std::uint8_t>();
    a.device = kGpu;
    const backend::NonzeroResult got = gpu_coords().nonzero(a);
    const std::string what = "from_dense B=" + std::to_string(batch) + " cells=" + std::to_string(cells);
    expect_same_array(want.coords, got.coords, what + " coords");
    expect_same_array(want.index, got.index, what + " index");
    EXPECT_EQ(want.counts, got.counts) << what;
  }
}

// ---- through lattice::ops with cuda arrays -----------------------------------------------------------

TEST(CudaAlgebraOps, AlignLookupAndCombineOnDeviceSetsMatchTheCpu) {
  LATTICE_REQUIRE_CUDA();
  const auto [l, r] = overlapping(500, 600, 81);
  const Array lc = rows_array(l), rc = rows_array(r);
  const auto cl = CoordinateSet::create(lc, {1, 1, 1}), cr = CoordinateSet::create(rc, {1, 1, 1});
  const auto gl = CoordinateSet::create(lc.to(kGpu), {1, 1, 1}), gr = CoordinateSet::create(rc.to(kGpu), {1, 1, 1});
  for (Join join : {Join::inner, Join::left, Join::right, Join::outer}) {
    const auto want = ops::align("sparse_add", cl, cr, join, {RouteId::algebra_reference});
    const auto got = ops::align("sparse_add", gl, gr, join);
    const std::string what = std::string(to_string(join));
    expect_same_array(want->lhs_rows, got->lhs_rows, what + " lhs_rows");
    expect_same_array(want->rhs_rows, got->rhs_rows, what + " rhs_rows");
    expect_same_array(want->output->coords(), got->output->coords(), what + " coords");
    EXPECT_EQ(want->output->batch_counts(), got->output->batch_counts()) << what;
    const Array lf = random_feats(lc.dim(0), 3, Dtype::f32, 82), rf = random_feats(rc.dim(0), 3, Dtype::f32, 83);
    for (AlgebraOp op : {AlgebraOp::sub, AlgebraOp::maximum, AlgebraOp::cat}) {
      const Array wf = ops::combine_forward(*want, op, lf, rf, {0.5, {RouteId::algebra_reference}});
      const Array gf = ops::combine_forward(*got, op, lf.to(kGpu), rf.to(kGpu), {0.5, {}});
      expect_same_array(wf, gf, what + " forward");
      const Array dout = random_feats(wf.dim(0), wf.dim(1), Dtype::f32, 84);
      const ops::CombineGrads wg =
          ops::combine_backward(*want, op, lf, rf, dout, true, true, {0.5, {RouteId::algebra_reference}});
      const ops::CombineGrads gg =
          ops::combine_backward(*got, op, lf.to(kGpu), rf.to(kGpu), dout.to(kGpu), true, true, {0.5, {}});
      expect_same_array(wg.lhs, gg.lhs, what + " dlhs");
      expect_same_array(wg.rhs, gg.rhs, what + " drhs");
    }
  }
  const Array q = rows_array(random_rows(400, 3, 40, 85, true));
  expect_same_array(ops::lookup_coords(cl, q), ops::lookup_coords(gl, q.to(kGpu)), "lookup_coords");
  expect_same_array(ops::contains_coords(cl, q), ops::contains_coords(gl, q.to(kGpu)), "contains_coords");
  expect_same_array(ops::union_coords(cl, cr), ops::union_coords(gl, gr), "union_coords");
  expect_same_array(ops::intersection_coords(cl, cr), ops::intersection_coords(gl, gr), "intersection_coords");
}

TEST(CudaAlgebraOps, MixedDevicesAreAValueError) {
  LATTICE_REQUIRE_CUDA();
  const Array c = rows_array(random_rows(10, 1, 5, 91));
  const auto cpu = CoordinateSet::create(c, {1, 1, 1});
  const auto gpu = CoordinateSet::create(c.to(kGpu), {1, 1, 1});
  EXPECT_EQ(message_of([&] { ops::align("sparse_add", cpu, gpu, Join::outer); }),
            "[sparse_add] rhs: expected a tensor on cpu, got cuda:0");
  EXPECT_EQ(message_of([&] { ops::lookup_coords(gpu, c); }),
            "[lookup_coords] queries: expected a tensor on cuda:0, got cpu");
  const Array mask = Array::zeros({10}, Dtype::u8);
  EXPECT_EQ(message_of([&] { ops::prune_rows(c.to(kGpu), mask); }),
            "[prune] mask: expected a tensor on cuda:0, got cpu");
  const auto a = ops::align("sparse_add", gpu, CoordinateSet::create(c.to(kGpu), {1, 1, 1}), Join::outer);
  const Array f = random_feats(10, 2, Dtype::f32, 92);
  EXPECT_EQ(message_of([&] { ops::combine_forward(*a, AlgebraOp::add, f, f.to(kGpu)); }),
            "[sparse_add] lhs: expected a tensor on cuda:0, got cpu");
}

TEST(CudaCoordsOps, CoordinateUtilitiesOnCudaArraysMatchTheCpu) {
  LATTICE_REQUIRE_CUDA();
  const Array c = rows_array(random_rows(3000, 3, 12, 101, true));
  const Array gc = c.to(kGpu);
  const ops::DownsampleOutput wd = ops::downsample_coords(c, {2, 2, 3});
  const ops::DownsampleOutput gd = ops::downsample_coords(gc, {2, 2, 3});
  expect_same_array(wd.coords, gd.coords, "downsample coords");
  expect_same_array(wd.inverse, gd.inverse, "downsample inverse");
  expect_same_array(ops::morton_codes(c), ops::morton_codes(gc), "morton_codes");
  expect_same_array(ops::morton_order(c), ops::morton_order(gc), "morton_order");
  Array mask = Array::empty({c.dim(0)}, Dtype::boolean);
  for (std::int64_t i = 0; i < c.dim(0); ++i) mask.data<bool>()[i] = (i * 7) % 3 == 0;
  expect_same_array(ops::prune_rows(c, mask), ops::prune_rows(gc, mask.to(kGpu)), "prune");
  expect_same_array(ops::crop_rows(c, {-2, -5, 0}, {3, 12, 4}), ops::crop_rows(gc, {-2, -5, 0}, {3, 12, 4}), "crop");
  const ops::CollateOutput wc = ops::collate_coords({c, c});
  const ops::CollateOutput gcol = ops::collate_coords({gc, gc});
  expect_same_array(wc.coords, gcol.coords, "collate");
  EXPECT_EQ(wc.counts, gcol.counts);
  const std::array<std::int64_t, 3> size{25, 25, 25};
  expect_same_array(ops::dense_index(c, {-12, -12, -12}, size), ops::dense_index(gc, {-12, -12, -12}, size), "dense");
  Array site = Array::zeros({2, 4, 5, 6}, Dtype::boolean);
  for (std::int64_t f = 0; f < site.numel(); f += 3) site.data<bool>()[f] = true;
  const ops::NonzeroOutput wn = ops::nonzero_sites(site, {1, -1, 0});
  const ops::NonzeroOutput gn = ops::nonzero_sites(site.to(kGpu), {1, -1, 0});
  expect_same_array(wn.coords, gn.coords, "from_dense coords");
  expect_same_array(wn.index, gn.index, "from_dense index");
  EXPECT_EQ(wn.counts, gn.counts);
  // Explanations name the CUDA routes.
  EXPECT_EQ(ops::explain_coords("morton_order", gc).chosen, RouteId::coords_cuda);
}

}  // namespace
}  // namespace lattice
