// Shared by the batch norm GoogleTest files (test_batch_norm.cpp, test_cuda_batch_norm.cpp):
// arrays of any float dtype from double values, values back as doubles, one call of the op
// through a forced route, and the comparison of two runs.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "lattice/core/array.h"
#include "lattice/core/dtype.h"
#include "lattice/ops/batch_norm.h"
#include "lattice/route/route.h"

namespace lattice::bn_test {

// A CPU array of `dtype` holding `values` rounded once, moved to `device`.
inline Array make(Dtype dtype, const std::vector<double>& values, Shape shape, Device device = Device::cpu()) {
  Array a = Array::empty(std::move(shape), dtype, Device::cpu());
  dispatch_float(dtype, "test", "values", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = a.data<T>();
    for (std::size_t i = 0; i < values.size(); ++i) p[i] = store<T>(static_cast<Accum<T>>(values[i]));
  });
  return device.is_cpu() ? a : a.to(device);
}

inline std::vector<double> values(const Array& arr) {
  if (!arr.defined()) return {};
  const Array a = arr.device().is_cpu() ? arr : arr.to(Device::cpu());
  std::vector<double> out(static_cast<std::size_t>(a.numel()));
  dispatch_float(a.dtype(), "test", "values", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* p = a.data<T>();
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<double>(load(p[i]));
  });
  return out;
}

inline Dtype accum(Dtype d) { return d == Dtype::f64 ? Dtype::f64 : Dtype::f32; }

// One forward + backward of a (N, C) problem with random inputs (features with a channel
// offset `offset`, so large means are exercised) through `route` on `device`.
struct Case {
  Dtype dtype = Dtype::f32;
  std::int64_t n = 100, c = 3;
  bool training = true, relu = false, affine = true;
  double offset = 0.0;
  unsigned seed = 1;
};

struct Result {
  std::vector<double> y, mean, invstd, rm, rv, dx, dw, db;
  // Per output element, the rounding any route in the accumulation type makes in y through
  // x - mean: a few units u of |x| + |mean|, scaled by |gamma| * invstd. It dominates when a
  // channel's rows are close (N = 2: x - mean is a small difference of two large values), as in
  // torch's own f32 batch norm. expect_results_close adds it to y's bound only when the expected
  // side is the reference route (double arithmetic, so it does not make that rounding); two fast
  // routes, which round alike, are held to the plain bound.
  std::vector<double> y_slack;
  bool reference = false;
};

inline Result run(const Case& k, RouteId route, Device device = Device::cpu()) {
  std::mt19937 gen(k.seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> uni(0.5, 2.0);
  const std::size_t nc = static_cast<std::size_t>(k.n * k.c), c = static_cast<std::size_t>(k.c);
  std::vector<double> x(nc), dy(nc), w(c), b(c), rm(c), rv(c);
  for (std::size_t i = 0; i < nc; ++i) x[i] = k.offset + 2.0 * normal(gen) + 0.1 * static_cast<double>(i % c);
  for (auto& v : dy) v = normal(gen);
  for (auto& v : w) v = normal(gen);
  for (auto& v : b) v = 0.3 * normal(gen);
  for (auto& v : rm) v = k.offset + normal(gen);
  for (auto& v : rv) v = uni(gen);
  const Dtype acc = accum(k.dtype);
  Array xa = make(k.dtype, x, {k.n, k.c}, device);
  Array wa = k.affine ? make(acc, w, {k.c}, device) : Array{};
  Array ba = k.affine ? make(acc, b, {k.c}, device) : Array{};
  Array rma = make(acc, rm, {k.c}, device);
  Array rva = make(acc, rv, {k.c}, device);
  ops::BatchNormOptions o;
  o.training = k.training;
  o.relu = k.relu;
  o.momentum = 0.1;
  o.eps = 1e-5;
  o.policy.force = route;
  const ops::BatchNormOutput f = ops::batch_norm_forward(xa, wa, ba, rma, rva, o);
  const Array dya = make(k.dtype, dy, {k.n, k.c}, device);
  const ops::BatchNormGrads g = ops::batch_norm_backward(dya, xa, f.y, wa, f.mean, f.invstd, true, true, o);
  Result r{values(f.y), values(f.mean), values(f.invstd), values(rma), values(rva),
           values(g.dx),  values(g.dweight), values(g.dbias), {}, route == RouteId::batch_norm_reference};
  const double u = acc == Dtype::f64 ? 0x1p-53 : 0x1p-24;
  const std::vector<double> xs = values(xa);
  r.y_slack.resize(nc);
  for (std::size_t i = 0; i < nc; ++i) {
    const std::size_t ch = i % c;
    const double gamma = k.affine ? std::fabs(w[ch]) : 1.0;
    r.y_slack[i] = 4.0 * u * (std::fabs(xs[i]) + std::fabs(r.mean[ch])) * r.invstd[ch] * gamma;
  }
  return r;
}

// |a - e| <= tol * max(|e|, scale), scale = max(mean |e|, floor): the oracle rule of tests/oracle
// (floor 1e-3). Input gradients of training use floor 0.1: with few rows dx cancels to nearly 0
// from terms of the size of gamma * invstd * dy (exactly 0 but for eps at N = 2), so its error is
// that of the terms.
inline void expect_close(const std::vector<double>& a, const std::vector<double>& e, double tol, const std::string& what,
                         double floor = 1e-3, const std::vector<double>* slack = nullptr) {
  ASSERT_EQ(a.size(), e.size()) << what;
  double scale = 0.0;
  for (double v : e) scale += std::fabs(v);
  scale = std::max(e.empty() ? 0.0 : scale / static_cast<double>(e.size()), floor);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double lim = tol * std::max(std::fabs(e[i]), scale) + (slack ? (*slack)[i] : 0.0);
    if (!(std::fabs(a[i] - e[i]) <= lim)) {
      if (bad++ < 3) ADD_FAILURE() << what << "[" << i << "]: " << a[i] << " vs " << e[i] << " (tol " << lim << ")";
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << a.size() << " elements off";
}

// Output tolerance of a dtype against a float64 computation (one rounding of the output plus f32
// arithmetic for 16-bit storage; gradients of 16-bit data see a few roundings).
inline double tol_of(Dtype d) {
  switch (d) {
    case Dtype::f64: return 1e-10;
    case Dtype::f32: return 2e-5;
    case Dtype::f16: return 4e-3;
    case Dtype::bf16: return 3e-2;
    default: return 0.0;
  }
}

inline void expect_results_close(const Result& a, const Result& e, Dtype d, const std::string& what) {
  const double t = tol_of(d), ts = d == Dtype::f64 ? 1e-10 : 2e-5;  // statistics are f32 / f64
  expect_close(a.y, e.y, t, what + " y", 1e-3, e.reference && e.y_slack.size() == e.y.size() ? &e.y_slack : nullptr);
  expect_close(a.mean, e.mean, ts, what + " mean");
  expect_close(a.invstd, e.invstd, ts * 10, what + " invstd");
  expect_close(a.rm, e.rm, ts, what + " running_mean");
  expect_close(a.rv, e.rv, ts * 10, what + " running_var");
  expect_close(a.dx, e.dx, t * 5, what + " dx", 0.1);
  expect_close(a.dw, e.dw, t * 5, what + " dweight");
  expect_close(a.db, e.db, t * 5, what + " dbias");
}

inline bool bitwise_equal(const Result& a, const Result& b) {
  return a.y == b.y && a.mean == b.mean && a.invstd == b.invstd && a.rm == b.rm && a.rv == b.rv && a.dx == b.dx &&
         a.dw == b.dw && a.db == b.db;
}

}  // namespace lattice::bn_test
