// The public SparseTensor-level C++ API (include/lattice/ops/conv.h, pool.h) tested through the
// public headers only: every convolution op (conv3d forward / onto a target / expand,
// subm_conv3d, conv_transpose3d generated / onto a target, generative_conv_transpose3d), the
// pool family (local sum / avg / max, onto a target, global sum / avg / max, pool_transpose3d,
// trilinear_upsample3d) and the weight-layout converters.
//
// Every result is checked twice:
//  1. against a brute-force loop written here from SEMANTICS.md alone (the relation table and
//     "Kernel geometry"): for every output row and every (input row, kernel row) pair it
//     evaluates the documented edge rule directly. No relation, coordinate index or kernel of
//     lattice is used to compute the expectation, so a wrong relation builder, a wrong output
//     support or a wrong kernel all show up as a mismatch;
//  2. against the same op with the `reference` route forced (RoutePolicy), bitwise.
// Features and weights are small integers, so every f32 / f64 sum is exact and the brute force
// must match bitwise (except the divisions of avg / pool_transpose / trilinear, compared within
// a few ulps). Backward passes (conv_backward, pool_backward) are checked the same way.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <lattice/lattice.h>
#include <lattice/ops/quantized.h>

namespace {

using namespace lattice;

struct Pt {
  std::int32_t b, x, y, z;
  auto operator<=>(const Pt&) const = default;
};

// Floor division (SEMANTICS.md: forward output = floor_div(c, s)).
std::int32_t floor_div(std::int32_t a, std::int32_t b) {
  std::int32_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

// Per-axis offsets of a kernel as documented: centered kinds put odd sizes at -r..r and even
// sizes at 0..K-1; transposed / generative kinds always 0..K-1; times dilation.
std::vector<std::int32_t> axis_offsets(std::int32_t size, std::int32_t dilation, bool centered) {
  std::vector<std::int32_t> o;
  const std::int32_t base = (centered && size % 2 == 1) ? -(size - 1) / 2 : 0;
  for (std::int32_t k = 0; k < size; ++k) o.push_back((base + k) * dilation);
  return o;
}

// Kernel rows enumerated x-major, z fastest: row = (x*Ky + y)*Kz + z.
std::vector<std::array<std::int32_t, 3>> kernel_offsets(Int3 size, Int3 dilation, bool centered) {
  const auto ox = axis_offsets(size[0], dilation[0], centered);
  const auto oy = axis_offsets(size[1], dilation[1], centered);
  const auto oz = axis_offsets(size[2], dilation[2], centered);
  std::vector<std::array<std::int32_t, 3>> out;
  for (auto a : ox)
    for (auto b : oy)
      for (auto c : oz) out.push_back({a, b, c});
  return out;
}

template <class T>
Array make_array(const std::vector<double>& v, Shape shape) {
  std::vector<T> t(v.begin(), v.end());
  return Array::from_vector(t, std::move(shape));
}

Array make_values(const std::vector<double>& v, Shape shape, Dtype dtype) {
  return dtype == Dtype::f64 ? make_array<double>(v, std::move(shape)) : make_array<float>(v, std::move(shape));
}

std::vector<double> values(const Array& a) {
  const Array c = a.contiguous();
  std::vector<double> out(static_cast<std::size_t>(c.numel()));
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = c.dtype() == Dtype::f64 ? c.data<double>()[i] : static_cast<double>(c.data<float>()[i]);
  return out;
}

std::vector<Pt> points(const SparseTensor& t) {
  const Array c = t.coords().contiguous();
  const std::int32_t* p = c.data<std::int32_t>();
  std::vector<Pt> out;
  for (std::int64_t i = 0; i < c.dim(0); ++i) out.push_back({p[4 * i], p[4 * i + 1], p[4 * i + 2], p[4 * i + 3]});
  return out;
}

SparseTensor make_tensor(const std::vector<Pt>& pts, const std::vector<double>& feats, std::int64_t c,
                         Dtype dtype, Int3 stride = {1, 1, 1},
                         std::optional<std::vector<std::int64_t>> batch_counts = {}) {
  std::vector<std::int32_t> flat;
  for (const Pt& p : pts) flat.insert(flat.end(), {p.b, p.x, p.y, p.z});
  const auto n = static_cast<std::int64_t>(pts.size());
  return SparseTensor(Array::from_vector(flat, {n, 4}), make_values(feats, {n, c}, dtype), stride,
                      std::move(batch_counts));
}

// Small integer values in [-3, 3], deterministic.
std::vector<double> ints(std::size_t n, int seed) {
  std::vector<double> v(n);
  std::uint32_t s = 2654435761u * static_cast<std::uint32_t>(seed + 1);
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<double>(static_cast<int>((s >> 16) % 7) - 3);
  }
  return v;
}

// Distinct values (for max pooling without ties): a permutation of 0..n-1 scaled, minus an offset.
std::vector<double> distinct(std::size_t n, int seed) {
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<double>((i * 7919 + static_cast<std::size_t>(seed) * 31) % n) - n / 2.0;
  return v;
}

// The input cloud of the tests: two batches, negative coordinates, neighbours and strays.
std::vector<Pt> cloud() {
  return {{0, 0, 0, 0},  {0, 1, 0, 0},   {0, 0, 1, 0}, {0, 1, 1, 1}, {0, -1, 0, 2}, {0, 2, 2, 2},
          {0, 3, -1, 0}, {0, -2, -2, -1}, {1, 0, 0, 0}, {1, 1, 0, 1}, {1, 4, 4, 4},  {1, 0, -1, 0}};
}

// ---- brute-force convolution (SEMANTICS.md "Relations" and "Convolution") ---------------------

struct BruteEdge {
  std::int64_t i, o, k;
};

// Every edge (i, o, k) of the documented rule, found by testing every triple.
std::vector<BruteEdge> brute_edges(RelationKind kind, const std::vector<Pt>& in, const std::vector<Pt>& out,
                                   Int3 size, Int3 stride, Int3 padding, Int3 dilation) {
  const bool centered =
      kind == RelationKind::submanifold || kind == RelationKind::forward || kind == RelationKind::target;
  const bool transposed = !centered;
  const auto offs = kernel_offsets(size, dilation, centered);
  std::vector<BruteEdge> e;
  for (std::size_t o = 0; o < out.size(); ++o)
    for (std::size_t i = 0; i < in.size(); ++i)
      for (std::size_t k = 0; k < offs.size(); ++k) {
        if (in[i].b != out[o].b) continue;
        const std::int32_t ci[3] = {in[i].x, in[i].y, in[i].z};
        const std::int32_t co[3] = {out[o].x, out[o].y, out[o].z};
        bool hit = true;
        for (int d = 0; d < 3; ++d) {
          if (transposed)
            hit = hit && co[d] == ci[d] * stride[d] + offs[k][d] - padding[d];
          else
            hit = hit && ci[d] == co[d] * stride[d] + offs[k][d] - padding[d];
        }
        if (hit) e.push_back({static_cast<std::int64_t>(i), static_cast<std::int64_t>(o), static_cast<std::int64_t>(k)});
      }
  return e;
}

// Y[o] = sum over edges X[i] @ W[k] (+ bias); W kernel-major (K, C_in, C_out).
std::vector<double> brute_conv(const std::vector<BruteEdge>& edges, std::size_t n_out, const std::vector<double>& x,
                               const std::vector<double>& w, const std::vector<double>* bias, std::int64_t c_in,
                               std::int64_t c_out) {
  std::vector<double> y(n_out * static_cast<std::size_t>(c_out), 0.0);
  if (bias)
    for (std::size_t o = 0; o < n_out; ++o)
      for (std::int64_t co = 0; co < c_out; ++co) y[o * c_out + co] = (*bias)[co];
  for (const auto& e : edges)
    for (std::int64_t ci = 0; ci < c_in; ++ci)
      for (std::int64_t co = 0; co < c_out; ++co)
        y[e.o * c_out + co] += x[e.i * c_in + ci] * w[(e.k * c_in + ci) * c_out + co];
  return y;
}

struct BruteGrads {
  std::vector<double> dx, dw, db;
};
BruteGrads brute_conv_backward(const std::vector<BruteEdge>& edges, std::size_t n_in, std::size_t n_out,
                               std::int64_t kv, const std::vector<double>& x, const std::vector<double>& w,
                               const std::vector<double>& dy, std::int64_t c_in, std::int64_t c_out) {
  BruteGrads g;
  g.dx.assign(n_in * c_in, 0.0);
  g.dw.assign(static_cast<std::size_t>(kv * c_in * c_out), 0.0);
  g.db.assign(static_cast<std::size_t>(c_out), 0.0);
  for (const auto& e : edges)
    for (std::int64_t ci = 0; ci < c_in; ++ci)
      for (std::int64_t co = 0; co < c_out; ++co) {
        g.dx[e.i * c_in + ci] += w[(e.k * c_in + ci) * c_out + co] * dy[e.o * c_out + co];
        g.dw[(e.k * c_in + ci) * c_out + co] += x[e.i * c_in + ci] * dy[e.o * c_out + co];
      }
  for (std::size_t o = 0; o < n_out; ++o)
    for (std::int64_t co = 0; co < c_out; ++co) g.db[co] += dy[o * c_out + co];
  return g;
}

// Kernel-major (K, C_in, C_out) -> dense (C_out, Kx, Ky, Kz, C_in) by index arithmetic.
std::vector<double> km_to_dense(const std::vector<double>& km, std::int64_t kv, std::int64_t c_in, std::int64_t c_out) {
  std::vector<double> d(km.size());
  for (std::int64_t co = 0; co < c_out; ++co)
    for (std::int64_t k = 0; k < kv; ++k)
      for (std::int64_t ci = 0; ci < c_in; ++ci) d[(co * kv + k) * c_in + ci] = km[(k * c_in + ci) * c_out + co];
  return d;
}

// Expected output supports, in the documented order.
std::vector<Pt> forward_support(const std::vector<Pt>& in, Int3 s) {
  std::vector<Pt> out;
  std::set<Pt> seen;
  for (const Pt& p : in) {
    const Pt q{p.b, floor_div(p.x, s[0]), floor_div(p.y, s[1]), floor_div(p.z, s[2])};
    if (seen.insert(q).second) out.push_back(q);
  }
  return out;
}
// expand: every o with o*s + off - p == c on every axis, input rows then kernel rows.
std::vector<Pt> expanded_support(const std::vector<Pt>& in, Int3 size, Int3 s, Int3 p, Int3 dil) {
  const auto offs = kernel_offsets(size, dil, true);
  std::vector<Pt> out;
  std::set<Pt> seen;
  for (const Pt& c : in)
    for (const auto& off : offs) {
      const std::int32_t cc[3] = {c.x, c.y, c.z};
      std::int32_t o[3];
      bool ok = true;
      for (int d = 0; d < 3; ++d) {
        const std::int32_t num = cc[d] + p[d] - off[d];
        ok = ok && (num % s[d] == 0);
        o[d] = floor_div(num, s[d]);
      }
      if (!ok) continue;
      const Pt q{c.b, o[0], o[1], o[2]};
      if (seen.insert(q).second) out.push_back(q);
    }
  return out;
}
// transposed / generative: unique c*s + off - p over (input row, kernel row), first occurrence.
std::vector<Pt> transposed_support(const std::vector<Pt>& in, Int3 size, Int3 s, Int3 p, Int3 dil) {
  const auto offs = kernel_offsets(size, dil, false);
  std::vector<Pt> out;
  std::set<Pt> seen;
  for (const Pt& c : in)
    for (const auto& off : offs) {
      const Pt q{c.b, c.x * s[0] + off[0] - p[0], c.y * s[1] + off[1] - p[1], c.z * s[2] + off[2] - p[2]};
      if (seen.insert(q).second) out.push_back(q);
    }
  return out;
}

void expect_same_values(const std::vector<double>& got, const std::vector<double>& want, double rel_tol,
                        const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (rel_tol == 0.0)
      ASSERT_EQ(got[i], want[i]) << what << " element " << i;
    else
      ASSERT_NEAR(got[i], want[i], rel_tol * std::max(1.0, std::abs(want[i]))) << what << " element " << i;
  }
}

bool bitwise_equal(const Array& a, const Array& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  return values(a) == values(b);
}

ops::ConvOptions with_reference(ops::ConvOptions o) {
  o.policy.force = RouteId::conv_reference;
  return o;
}
ops::PoolOptions with_reference(ops::PoolOptions o) {
  o.policy.force = RouteId::pool_reference;
  return o;
}

// ---- convolution -------------------------------------------------------------------------------

enum class Call { conv3d, conv3d_target, subm, transpose, transpose_target, generative };

struct ConvCase {
  std::string name;
  Call call;
  ops::ConvOptions options;
};

RelationKind kind_of(Call c) {
  switch (c) {
    case Call::conv3d: return RelationKind::forward;
    case Call::conv3d_target: return RelationKind::target;
    case Call::subm: return RelationKind::submanifold;
    case Call::transpose: return RelationKind::transposed;
    case Call::transpose_target: return RelationKind::transposed_target;
    case Call::generative: return RelationKind::generative;
  }
  return RelationKind::forward;
}
const char* op_name(Call c) {
  switch (c) {
    case Call::conv3d:
    case Call::conv3d_target: return "conv3d";
    case Call::subm: return "subm_conv3d";
    case Call::transpose:
    case Call::transpose_target: return "conv_transpose3d";
    case Call::generative: return "generative_conv_transpose3d";
  }
  return "";
}

SparseTensor call_op(Call c, const SparseTensor& x, const Array& w, const ops::ConvOptions& o, const Array* bias,
                     const SparseTensor* target) {
  switch (c) {
    case Call::conv3d: return ops::conv3d(x, w, o, bias);
    case Call::conv3d_target: return ops::conv3d(x, w, o, bias, target);
    case Call::subm: return ops::subm_conv3d(x, w, o, bias);
    case Call::transpose: return ops::conv_transpose3d(x, w, o, bias);
    case Call::transpose_target: return ops::conv_transpose3d(x, w, o, bias, target);
    case Call::generative: return ops::generative_conv_transpose3d(x, w, o, bias);
  }
  return {};
}

std::vector<ConvCase> conv_cases() {
  using O = ops::ConvOptions;
  return {
      {"subm_k3", Call::subm, O{.kernel_size = {3, 3, 3}}},
      {"subm_k3x1x5_dil2", Call::subm, O{.kernel_size = {3, 1, 5}, .dilation = {2, 1, 1}}},
      {"conv3d_k2_s2", Call::conv3d, O{.kernel_size = {2, 2, 2}, .stride = {2, 2, 2}}},
      {"conv3d_k3_s2_p1", Call::conv3d, O{.kernel_size = {3, 3, 3}, .stride = {2, 2, 2}, .padding = {1, 1, 1}}},
      {"conv3d_k3_s1", Call::conv3d, O{.kernel_size = {3, 3, 3}}},
      {"conv3d_k1", Call::conv3d, O{.kernel_size = {1, 1, 1}}},
      {"conv3d_expand_k3_s2_p1", Call::conv3d,
       O{.kernel_size = {3, 3, 3}, .stride = {2, 2, 2}, .padding = {1, 1, 1}, .expand = true}},
      {"conv3d_expand_k3_s1", Call::conv3d, O{.kernel_size = {3, 3, 3}, .expand = true}},
      {"conv3d_target_k3_s2_p1", Call::conv3d_target,
       O{.kernel_size = {3, 3, 3}, .stride = {2, 2, 2}, .padding = {1, 1, 1}}},
      {"transpose_k2_s2", Call::transpose, O{.kernel_size = {2, 2, 2}, .stride = {2, 2, 2}}},
      {"transpose_k3_s2_p1", Call::transpose, O{.kernel_size = {3, 3, 3}, .stride = {2, 2, 2}, .padding = {1, 1, 1}}},
      {"transpose_target_k3_s2", Call::transpose_target, O{.kernel_size = {3, 3, 3}, .stride = {2, 2, 2}}},
      {"generative_k2_s2", Call::generative, O{.kernel_size = {2, 2, 2}, .stride = {2, 2, 2}}},
      {"generative_k3_s2_dil1", Call::generative, O{.kernel_size = {3, 2, 3}, .stride = {2, 2, 1}}},
  };
}

// The input of a case: transposed kinds start from a stride-2 tensor (their output stride is
// the input stride / s), the others from stride 1.
SparseTensor case_input(const ConvCase& cc, Dtype dtype, std::int64_t c_in) {
  const auto pts = cloud();
  const bool transposed = is_transposed_kind(kind_of(cc.call));
  return make_tensor(pts, ints(pts.size() * c_in, 1), c_in, dtype, transposed ? cc.options.stride : Int3{1, 1, 1});
}

// The target of the target kinds: some rows with edges, one without (gets zeros + bias).
SparseTensor case_target(const ConvCase& cc, Dtype dtype, std::int64_t c) {
  std::vector<Pt> t;
  if (cc.call == Call::conv3d_target) t = {{0, 0, 0, 0}, {0, 1, 1, 1}, {1, 0, 0, 0}, {0, 9, 9, 9}, {1, 2, 2, 2}};
  else t = {{0, 1, 1, 1}, {0, 0, 0, 0}, {0, 2, 1, 0}, {1, 9, 9, 9}, {1, 1, 0, 2}, {0, -2, 0, 4}};
  const Int3 stride = cc.call == Call::conv3d_target ? cc.options.stride : Int3{1, 1, 1};
  return make_tensor(t, std::vector<double>(t.size() * c, 0.0), c, dtype, stride);
}

class ConvApi : public ::testing::TestWithParam<std::tuple<ConvCase, Dtype>> {};

// Forward: output support (documented order) and features equal the brute force bitwise, the
// reference route bitwise, with and without bias, in both weight layouts; output stride as
// documented; subm keeps the input's key.
TEST_P(ConvApi, ForwardMatchesBruteForceAndReference) {
  const auto& [cc, dtype] = GetParam();
  const std::int64_t c_in = 3, c_out = 2;
  const SparseTensor x = case_input(cc, dtype, c_in);
  const SparseTensor target = case_target(cc, dtype, c_out);
  const Int3 size = cc.options.kernel_size;
  const std::int64_t kv = static_cast<std::int64_t>(size[0]) * size[1] * size[2];
  const std::vector<double> wv = ints(static_cast<std::size_t>(kv * c_in * c_out), 2);
  const std::vector<double> bv = {1.0, -2.0};
  const Array w = make_values(wv, {kv, c_in, c_out}, dtype);
  const Array wd = make_values(km_to_dense(wv, kv, c_in, c_out), {c_out, size[0], size[1], size[2], c_in}, dtype);
  const Array b = make_values(bv, {c_out}, dtype);
  const SparseTensor* tp =
      (cc.call == Call::conv3d_target || cc.call == Call::transpose_target) ? &target : nullptr;

  const SparseTensor y = call_op(cc.call, x, w, cc.options, nullptr, tp);
  const SparseTensor yb = call_op(cc.call, x, w, cc.options, &b, tp);
  const SparseTensor yd = call_op(cc.call, x, wd, cc.options, &b, tp);
  const SparseTensor yr = call_op(cc.call, x, w, with_reference(cc.options), &b, tp);

  // Output support.
  const auto in_pts = points(x);
  const auto s = cc.options.stride, p = cc.options.padding, dil = cc.options.dilation;
  std::vector<Pt> want_support;
  Int3 want_stride = x.stride();
  switch (cc.call) {
    case Call::subm: want_support = in_pts; break;
    case Call::conv3d:
      want_support = cc.options.expand ? expanded_support(in_pts, size, s, p, dil)
                     : (s == Int3{1, 1, 1} && p == Int3{0, 0, 0}) ? in_pts
                                                                   : forward_support(in_pts, s);
      for (int d = 0; d < 3; ++d) want_stride[d] *= s[d];
      break;
    case Call::conv3d_target:
    case Call::transpose_target:
      want_support = points(target);
      want_stride = target.stride();
      break;
    case Call::transpose:
    case Call::generative:
      want_support = transposed_support(in_pts, size, s, p, dil);
      for (int d = 0; d < 3; ++d) want_stride[d] /= s[d];
      break;
  }
  EXPECT_EQ(points(y), want_support) << cc.name;
  EXPECT_EQ(y.stride(), want_stride) << cc.name;
  EXPECT_EQ(points(yr), want_support) << cc.name;
  if (cc.call == Call::subm) EXPECT_EQ(y.key(), x.key());
  if (tp) EXPECT_EQ(y.key(), tp->key());
  ASSERT_EQ(y.feats().dtype(), dtype);

  // Features.
  const auto edges = brute_edges(kind_of(cc.call), in_pts, want_support, size, s, p, dil);
  ASSERT_FALSE(edges.empty()) << cc.name << ": the case must exercise some edges";
  const std::vector<double> xv = values(x.feats());
  expect_same_values(values(y.feats()), brute_conv(edges, want_support.size(), xv, wv, nullptr, c_in, c_out), 0.0,
                     cc.name + " no bias");
  expect_same_values(values(yb.feats()), brute_conv(edges, want_support.size(), xv, wv, &bv, c_in, c_out), 0.0,
                     cc.name + " bias");
  EXPECT_TRUE(bitwise_equal(yd.feats(), yb.feats())) << cc.name << ": dense layout differs from kernel-major";
  EXPECT_TRUE(bitwise_equal(yr.feats(), yb.feats())) << cc.name << ": auto route differs from reference";
}

// Backward: conv_backward's input, weight (in the layout passed) and bias gradients equal the
// brute-force transposed sums bitwise and the reference route's.
TEST_P(ConvApi, BackwardMatchesBruteForceAndReference) {
  const auto& [cc, dtype] = GetParam();
  const std::int64_t c_in = 2, c_out = 3;
  const SparseTensor x = case_input(cc, dtype, c_in);
  const SparseTensor target = case_target(cc, dtype, c_out);
  const bool has_target = cc.call == Call::conv3d_target || cc.call == Call::transpose_target;
  const Int3 size = cc.options.kernel_size;
  const std::int64_t kv = static_cast<std::int64_t>(size[0]) * size[1] * size[2];
  const std::vector<double> wv = ints(static_cast<std::size_t>(kv * c_in * c_out), 3);
  const Array w = make_values(wv, {kv, c_in, c_out}, dtype);
  const Array wd = make_values(km_to_dense(wv, kv, c_in, c_out), {c_out, size[0], size[1], size[2], c_in}, dtype);

  const ops::ConvPlan plan =
      ops::plan_conv(op_name(cc.call), kind_of(cc.call), x, cc.options, has_target ? &target : nullptr);
  const ops::ConvPlan ref =
      ops::plan_conv(op_name(cc.call), kind_of(cc.call), x, with_reference(cc.options), has_target ? &target : nullptr);
  const auto n_out = static_cast<std::size_t>(plan.output->size());
  const std::vector<double> dyv = ints(n_out * c_out, 4);
  const Array dy = make_values(dyv, {static_cast<std::int64_t>(n_out), c_out}, dtype);

  const ops::ConvGradRequest all{.input = true, .weight = true, .bias = true};
  const ops::ConvGrads g = ops::conv_backward(plan, x.feats(), w, dy, all);
  const ops::ConvGrads gd = ops::conv_backward(plan, x.feats(), wd, dy, all);
  const ops::ConvGrads gr = ops::conv_backward(ref, x.feats(), w, dy, all);

  // Expected from the documented rule on the documented output support (plan.output, whose
  // correctness the forward test checks).
  std::vector<Pt> out_pts;
  {
    const SparseTensor support(plan.output, Array::zeros({plan.output->size(), 1}, dtype));
    out_pts = points(support);
  }
  const auto edges = brute_edges(kind_of(cc.call), points(x), out_pts, size, cc.options.stride, cc.options.padding,
                                 cc.options.dilation);
  const BruteGrads want =
      brute_conv_backward(edges, static_cast<std::size_t>(x.size()), n_out, kv, values(x.feats()), wv, dyv, c_in, c_out);
  expect_same_values(values(g.input), want.dx, 0.0, cc.name + " dx");
  expect_same_values(values(g.weight), want.dw, 0.0, cc.name + " dw");
  expect_same_values(values(g.bias), want.db, 0.0, cc.name + " dbias");
  EXPECT_EQ(g.weight.shape(), (Shape{kv, c_in, c_out}));
  EXPECT_EQ(gd.weight.shape(), (Shape{c_out, size[0], size[1], size[2], c_in})) << "dense weight gives a dense gradient";
  expect_same_values(values(gd.weight), km_to_dense(want.dw, kv, c_in, c_out), 0.0, cc.name + " dense dw");
  EXPECT_TRUE(bitwise_equal(gr.input, g.input)) << cc.name;
  EXPECT_TRUE(bitwise_equal(gr.weight, g.weight)) << cc.name;
  EXPECT_TRUE(bitwise_equal(gr.bias, g.bias)) << cc.name;

  // A partial request leaves the others undefined.
  const ops::ConvGrads only_w = ops::conv_backward(plan, x.feats(), w, dy, {.input = false, .weight = true, .bias = false});
  EXPECT_FALSE(only_w.input.defined());
  EXPECT_FALSE(only_w.bias.defined());
  EXPECT_TRUE(bitwise_equal(only_w.weight, g.weight));
}

INSTANTIATE_TEST_SUITE_P(Api, ConvApi,
                         ::testing::Combine(::testing::ValuesIn(conv_cases()),
                                            ::testing::Values(Dtype::f32, Dtype::f64)),
                         [](const auto& info) {
                           return std::get<0>(info.param).name + "_" +
                                  std::string(std::get<1>(info.param) == Dtype::f64 ? "f64" : "f32");
                         });

// A hand-computed case independent even of the brute force above: a 1x1x3 submanifold kernel
// along z on three collinear points, C_in = C_out = 1, W = (1, 10, 100) in kernel rows z = -1, 0, 1.
// Row at z: y(z) = 1*x(z-1) + 10*x(z) + 100*x(z+1).
TEST(ConvApiHand, SubmanifoldLineByHand) {
  const SparseTensor x = make_tensor({{0, 0, 0, 0}, {0, 0, 0, 1}, {0, 0, 0, 2}}, {1, 2, 3}, 1, Dtype::f64);
  const Array w = Array::from_vector(std::vector<double>{1, 10, 100}, {3, 1, 1});
  const SparseTensor y = ops::subm_conv3d(x, w, {.kernel_size = {1, 1, 3}});
  EXPECT_EQ(values(y.feats()), (std::vector<double>{0 + 10 * 1 + 100 * 2, 1 * 1 + 10 * 2 + 100 * 3, 1 * 2 + 10 * 3 + 0}));
}

// ---- weight layouts ----------------------------------------------------------------------------

// weight_spconv_to_dense against the documented layouts: spconv (Kx, Ky, Kz, C_out, C_in) ->
// dense (C_out, Kx, Ky, Kz, C_in), i.e. dense[co, x, y, z, ci] == spconv[x, y, z, co, ci], on a
// non-cubic kernel with every element distinct; the other two converters against the
// kernel-row rule row = (x*Ky + y)*Kz + z; round trips; non-float dtypes move bytes unchanged.
TEST(WeightLayouts, SpconvToDensePermutationByBruteForce) {
  const std::int64_t kx = 2, ky = 3, kz = 4, c_out = 3, c_in = 5;
  std::vector<double> sp(static_cast<std::size_t>(kx * ky * kz * c_out * c_in));
  for (std::size_t i = 0; i < sp.size(); ++i) sp[i] = static_cast<double>(i);
  const Array spa = Array::from_vector(sp, {kx, ky, kz, c_out, c_in});
  const Array dense = ops::weight_spconv_to_dense(spa);
  ASSERT_EQ(dense.shape(), (Shape{c_out, kx, ky, kz, c_in}));
  const std::vector<double> d = values(dense);
  for (std::int64_t co = 0; co < c_out; ++co)
    for (std::int64_t x = 0; x < kx; ++x)
      for (std::int64_t y = 0; y < ky; ++y)
        for (std::int64_t z = 0; z < kz; ++z)
          for (std::int64_t ci = 0; ci < c_in; ++ci)
            ASSERT_EQ(d[(((co * kx + x) * ky + y) * kz + z) * c_in + ci],
                      sp[(((x * ky + y) * kz + z) * c_out + co) * c_in + ci])
                << co << " " << x << " " << y << " " << z << " " << ci;

  // dense -> kernel-major: km[(x*Ky + y)*Kz + z, ci, co] == dense[co, x, y, z, ci].
  const Array km = ops::weight_dense_to_kernel_major(dense);
  ASSERT_EQ(km.shape(), (Shape{kx * ky * kz, c_in, c_out}));
  const std::vector<double> k = values(km);
  for (std::int64_t co = 0; co < c_out; ++co)
    for (std::int64_t x = 0; x < kx; ++x)
      for (std::int64_t y = 0; y < ky; ++y)
        for (std::int64_t z = 0; z < kz; ++z)
          for (std::int64_t ci = 0; ci < c_in; ++ci)
            ASSERT_EQ(k[(((x * ky + y) * kz + z) * c_in + ci) * c_out + co],
                      d[(((co * kx + x) * ky + y) * kz + z) * c_in + ci]);
  const Array back = ops::weight_kernel_major_to_dense(km, {static_cast<std::int32_t>(kx), static_cast<std::int32_t>(ky),
                                                            static_cast<std::int32_t>(kz)});
  EXPECT_EQ(back.shape(), dense.shape());
  EXPECT_EQ(values(back), d);

  // int32 weights (packed-word-like) are moved byte-exactly too.
  std::vector<std::int32_t> si(sp.size());
  for (std::size_t i = 0; i < si.size(); ++i) si[i] = static_cast<std::int32_t>(i * 3 + 1);
  const Array di = ops::weight_spconv_to_dense(Array::from_vector(si, {kx, ky, kz, c_out, c_in}));
  for (std::size_t i = 0; i < si.size(); ++i)
    ASSERT_EQ(di.data<std::int32_t>()[i], static_cast<std::int32_t>(d[i]) * 3 + 1);
}

// A convolution with a spconv-layout checkpoint converted by weight_spconv_to_dense equals the
// brute-force convolution that reads the spconv array directly (W[k][ci][co] = sp[x,y,z,co,ci]).
TEST(WeightLayouts, SpconvWeightConvolvesAsDocumented) {
  const std::int64_t c_in = 2, c_out = 3;
  const Int3 size{3, 3, 3};
  std::vector<double> sp(static_cast<std::size_t>(27 * c_out * c_in));
  const auto r = ints(sp.size(), 9);
  std::copy(r.begin(), r.end(), sp.begin());
  std::vector<double> km(sp.size());
  for (std::int64_t kk = 0; kk < 27; ++kk)
    for (std::int64_t co = 0; co < c_out; ++co)
      for (std::int64_t ci = 0; ci < c_in; ++ci) km[(kk * c_in + ci) * c_out + co] = sp[(kk * c_out + co) * c_in + ci];
  const auto pts = cloud();
  const SparseTensor x = make_tensor(pts, ints(pts.size() * c_in, 5), c_in, Dtype::f64);
  const Array dense = ops::weight_spconv_to_dense(Array::from_vector(sp, {3, 3, 3, c_out, c_in}));
  const SparseTensor y = ops::subm_conv3d(x, dense, {.kernel_size = size});
  const auto edges = brute_edges(RelationKind::submanifold, pts, pts, size, {1, 1, 1}, {0, 0, 0}, {1, 1, 1});
  expect_same_values(values(y.feats()), brute_conv(edges, pts.size(), values(x.feats()), km, nullptr, c_in, c_out), 0.0,
                     "spconv weight");
}

TEST(WeightLayouts, ConvertersRejectWrongRanks) {
  const Array w4 = Array::zeros({3, 3, 3, 2}, Dtype::f32);
  try {
    (void)ops::weight_spconv_to_dense(w4);
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_STREQ(e.what(), "[weight_spconv_to_dense] weight: expected (Kx, Ky, Kz, C_out, C_in), got (3, 3, 3, 2)");
  }
  try {
    (void)ops::weight_dense_to_kernel_major(w4);
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_STREQ(e.what(), "[weight_dense_to_kernel_major] weight: expected (C_out, Kx, Ky, Kz, C_in), got (3, 3, 3, 2)");
  }
  try {
    (void)ops::weight_kernel_major_to_dense(Array::zeros({8, 2, 3}, Dtype::f32), {3, 3, 3});
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_STREQ(e.what(), "[weight_kernel_major_to_dense] weight: expected (K=27, C_in, C_out), got (8, 2, 3)");
  }
}

// ---- pooling -----------------------------------------------------------------------------------

struct BrutePool {
  std::vector<double> y;
  std::vector<std::int64_t> argmax;  // max only: winning input row per (o, c), -1 when none
};

// Local pooling over edges (o-major; the brute edge list is (o, i, k) ordered, which is the
// documented (input row, kernel row) tie order within each output row).
BrutePool brute_pool(PoolMode mode, const std::vector<BruteEdge>& edges, std::size_t n_out, const std::vector<double>& x,
                     std::int64_t c) {
  BrutePool r;
  r.y.assign(n_out * c, 0.0);
  r.argmax.assign(n_out * c, -1);
  std::vector<std::int64_t> count(n_out, 0);
  for (const auto& e : edges) {
    ++count[e.o];
    for (std::int64_t j = 0; j < c; ++j) {
      const double v = x[e.i * c + j];
      auto& a = r.argmax[e.o * c + j];
      if (mode == PoolMode::max) {
        if (a < 0 || v > r.y[e.o * c + j]) {
          r.y[e.o * c + j] = v;
          a = e.i;
        }
      } else {
        r.y[e.o * c + j] += v;
      }
    }
  }
  if (mode == PoolMode::avg)
    for (std::size_t o = 0; o < n_out; ++o)
      for (std::int64_t j = 0; j < c; ++j)
        if (count[o]) r.y[o * c + j] /= static_cast<double>(count[o]);
  return r;
}

std::vector<double> brute_pool_backward(PoolMode mode, const std::vector<BruteEdge>& edges, const BrutePool& fwd,
                                        std::size_t n_in, std::size_t n_out, const std::vector<double>& dy,
                                        std::int64_t c) {
  std::vector<double> dx(n_in * c, 0.0);
  std::vector<std::int64_t> count(n_out, 0);
  for (const auto& e : edges) ++count[e.o];
  if (mode == PoolMode::max) {
    for (std::size_t o = 0; o < n_out; ++o)
      for (std::int64_t j = 0; j < c; ++j)
        if (fwd.argmax[o * c + j] >= 0) dx[fwd.argmax[o * c + j] * c + j] += dy[o * c + j];
    return dx;
  }
  for (const auto& e : edges)
    for (std::int64_t j = 0; j < c; ++j)
      dx[e.i * c + j] += mode == PoolMode::avg ? dy[e.o * c + j] / static_cast<double>(count[e.o]) : dy[e.o * c + j];
  return dx;
}

struct PoolCase {
  std::string name;
  PoolMode mode;
  ops::PoolOptions options;
  bool target = false;
};

std::vector<PoolCase> pool_cases() {
  using O = ops::PoolOptions;
  std::vector<PoolCase> out;
  for (PoolMode m : {PoolMode::sum, PoolMode::avg, PoolMode::max}) {
    const std::string n = std::string(to_string(m));
    out.push_back({n + "_k2_s2", m, O{}});                                                   // input-exclusive
    out.push_back({n + "_k3_s2_p1", m, O{.kernel_size = {3, 3, 3}, .padding = {1, 1, 1}}});  // overlapping
    out.push_back({n + "_k3_s1", m, O{.kernel_size = {3, 3, 3}, .stride = {1, 1, 1}}});
    out.push_back({n + "_expand_k3_s2_p1", m, O{.kernel_size = {3, 3, 3}, .padding = {1, 1, 1}, .expand = true}});
    out.push_back({n + "_target_k3_s2_p1", m, O{.kernel_size = {3, 3, 3}, .padding = {1, 1, 1}}, true});
  }
  return out;
}

class PoolApi : public ::testing::TestWithParam<std::tuple<PoolCase, Dtype>> {};

// Local pooling through the one-call API (pool3d and the per-mode functions) and through
// plan_pool + pool_forward + pool_backward: support, values, argmax and the feature gradient
// equal the brute force (sum/max bitwise, avg within an ulp) and the reference route bitwise.
TEST_P(PoolApi, LocalPoolingMatchesBruteForceAndReference) {
  const auto& [pc, dtype] = GetParam();
  const std::int64_t c = 3;
  const auto pts = cloud();
  const SparseTensor x = make_tensor(pts, pc.mode == PoolMode::max ? distinct(pts.size() * c, 1) : ints(pts.size() * c, 1),
                                     c, dtype);
  const std::vector<Pt> tpts = {{0, 0, 0, 0}, {1, 0, 0, 0}, {0, 7, 7, 7}, {0, 1, 1, 1}, {1, 2, 2, 2}};
  const SparseTensor target = make_tensor(tpts, std::vector<double>(tpts.size() * c, 0.0), c, dtype, pc.options.stride);
  const SparseTensor* tp = pc.target ? &target : nullptr;

  const SparseTensor y = ops::pool3d(x, pc.mode, pc.options, tp);
  const SparseTensor yr = ops::pool3d(x, pc.mode, with_reference(pc.options), tp);
  if (!pc.target) {
    const SparseTensor y2 = pc.mode == PoolMode::sum   ? ops::sum_pool3d(x, pc.options)
                            : pc.mode == PoolMode::avg ? ops::avg_pool3d(x, pc.options)
                                                       : ops::max_pool3d(x, pc.options);
    EXPECT_TRUE(bitwise_equal(y2.feats(), y.feats())) << pc.name << ": per-mode function differs from pool3d";
  }

  const auto& o = pc.options;
  const std::vector<Pt> want_support = pc.target ? tpts
                                       : o.expand ? expanded_support(pts, o.kernel_size, o.stride, o.padding, o.dilation)
                                       : (o.stride == Int3{1, 1, 1} && o.padding == Int3{0, 0, 0}) ? pts
                                                                                                  : forward_support(pts, o.stride);
  EXPECT_EQ(points(y), want_support) << pc.name;
  Int3 want_stride{o.stride};
  EXPECT_EQ(y.stride(), want_stride) << pc.name;

  const auto edges = brute_edges(pc.target ? RelationKind::target : RelationKind::forward, pts, want_support,
                                 o.kernel_size, o.stride, o.padding, o.dilation);
  ASSERT_FALSE(edges.empty());
  const BrutePool want = brute_pool(pc.mode, edges, want_support.size(), values(x.feats()), c);
  const double tol = pc.mode == PoolMode::avg ? (dtype == Dtype::f64 ? 2e-15 : 1e-6) : 0.0;
  expect_same_values(values(y.feats()), want.y, tol, pc.name + " forward");
  EXPECT_TRUE(bitwise_equal(yr.feats(), y.feats())) << pc.name << ": auto route differs from reference";

  // Backward through the plan API.
  const std::string op = pc.mode == PoolMode::sum ? "sum_pool3d" : pc.mode == PoolMode::avg ? "avg_pool3d" : "max_pool3d";
  const auto tset = pc.target ? target.coordinate_set() : std::shared_ptr<CoordinateSet>{};
  const ops::PoolPlan plan = ops::plan_pool(op, pc.mode, x.coordinate_set(), o, tset);
  const ops::PoolPlan ref = ops::plan_pool(op, pc.mode, x.coordinate_set(), with_reference(o), tset);
  const ops::PoolOutput f = ops::pool_forward(plan, x.feats());
  const ops::PoolOutput fr = ops::pool_forward(ref, x.feats());
  EXPECT_TRUE(bitwise_equal(f.out, y.feats()));
  if (pc.mode == PoolMode::max) {
    ASSERT_TRUE(f.argmax.defined());
    const Array am = f.argmax.contiguous();
    for (std::size_t i = 0; i < want.argmax.size(); ++i) ASSERT_EQ(am.data<std::int32_t>()[i], want.argmax[i]) << i;
  }
  const std::vector<double> dyv = ints(want_support.size() * c, 6);
  const Array dy = make_values(dyv, {static_cast<std::int64_t>(want_support.size()), c}, dtype);
  const Array dx = ops::pool_backward(plan, dy, pc.mode == PoolMode::max ? &f.argmax : nullptr);
  const Array dxr = ops::pool_backward(ref, dy, pc.mode == PoolMode::max ? &fr.argmax : nullptr);
  expect_same_values(values(dx), brute_pool_backward(pc.mode, edges, want, pts.size(), want_support.size(), dyv, c), tol,
                     pc.name + " backward");
  EXPECT_TRUE(bitwise_equal(dxr, dx)) << pc.name << ": auto backward differs from reference";
}

INSTANTIATE_TEST_SUITE_P(Api, PoolApi,
                         ::testing::Combine(::testing::ValuesIn(pool_cases()),
                                            ::testing::Values(Dtype::f32, Dtype::f64)),
                         [](const auto& info) {
                           return std::get<0>(info.param).name + "_" +
                                  std::string(std::get<1>(info.param) == Dtype::f64 ? "f64" : "f32");
                         });

// Max ties: forward takes the first edge in (input row, kernel row) order and the gradient goes
// entirely to that row (SEMANTICS.md "Pooling").
TEST(PoolApiHand, MaxTieGoesToTheFirstInputRow) {
  // Rows 0..3 all pool into output (0, 0, 0, 0) with k=2, s=2; rows 1 and 3 tie at 5.
  const SparseTensor x =
      make_tensor({{0, 1, 0, 0}, {0, 0, 1, 0}, {0, 0, 0, 0}, {0, 1, 1, 1}}, {1, 5, 2, 5}, 1, Dtype::f32);
  const ops::PoolPlan plan = ops::plan_pool("max_pool3d", PoolMode::max, x.coordinate_set(), {});
  const ops::PoolOutput f = ops::pool_forward(plan, x.feats());
  EXPECT_EQ(values(f.out), (std::vector<double>{5}));
  EXPECT_EQ(f.argmax.data<std::int32_t>()[0], 1);
  const Array dx = ops::pool_backward(plan, Array::from_vector(std::vector<float>{2.0f}, {1, 1}), &f.argmax);
  EXPECT_EQ(values(dx), (std::vector<double>{0, 2, 0, 0}));
}

// Global pooling: (B, C) per batch; B = max batch id + 1 without batch_counts, len(batch_counts)
// with; an empty batch gives 0 for sum / avg and a ValueError for max.
TEST(PoolApiGlobal, GlobalPoolsMatchBruteForceAndReference) {
  for (Dtype dtype : {Dtype::f32, Dtype::f64}) {
    const std::int64_t c = 2;
    // Batches 0 and 2 (batch 1 empty), unsorted rows.
    const std::vector<Pt> pts = {{2, 0, 0, 0}, {0, 1, 0, 0}, {0, 5, 5, 5}, {2, -1, 3, 0}, {0, 2, 2, 2}};
    const std::vector<double> fv = distinct(pts.size() * c, 3);
    const SparseTensor x = make_tensor(pts, fv, c, dtype);
    std::vector<double> sum(3 * c, 0.0), mx(3 * c, -1e300), cnt(3, 0.0);
    for (std::size_t i = 0; i < pts.size(); ++i) {
      cnt[pts[i].b] += 1;
      for (std::int64_t j = 0; j < c; ++j) {
        sum[pts[i].b * c + j] += fv[i * c + j];
        mx[pts[i].b * c + j] = std::max(mx[pts[i].b * c + j], fv[i * c + j]);
      }
    }
    std::vector<double> avg(sum);
    for (std::size_t b = 0; b < 3; ++b)
      for (std::int64_t j = 0; j < c; ++j) avg[b * c + j] = cnt[b] ? sum[b * c + j] / cnt[b] : 0.0;
    const Array gs = ops::global_sum_pool(x);
    EXPECT_EQ(gs.shape(), (Shape{3, c}));
    expect_same_values(values(gs), sum, 0.0, "global sum");
    expect_same_values(values(ops::global_avg_pool(x)), avg, dtype == Dtype::f64 ? 2e-15 : 1e-6, "global avg");
    EXPECT_THROW((void)ops::global_max_pool(x), ValueError);

    // Reference route, and the backward of global avg: every row gets dY[b] / count_b.
    ops::PoolOptions ref{};
    ref.policy.force = RouteId::pool_reference;
    for (PoolMode m : {PoolMode::sum, PoolMode::avg}) {
      const ops::PoolPlan p = ops::plan_global_pool("global_pool", m, x.coordinate_set());
      const ops::PoolPlan pr = ops::plan_global_pool("global_pool", m, x.coordinate_set(), ref);
      EXPECT_TRUE(bitwise_equal(ops::pool_forward(p, x.feats()).out, ops::pool_forward(pr, x.feats()).out));
      const std::vector<double> dyv = ints(3 * c, 8);
      const Array dy = make_values(dyv, {3, c}, dtype);
      const Array dx = ops::pool_backward(p, dy);
      std::vector<double> want(pts.size() * c);
      for (std::size_t i = 0; i < pts.size(); ++i)
        for (std::int64_t j = 0; j < c; ++j)
          want[i * c + j] = m == PoolMode::sum ? dyv[pts[i].b * c + j] : dyv[pts[i].b * c + j] / cnt[pts[i].b];
      expect_same_values(values(dx), want, dtype == Dtype::f64 ? 2e-15 : 1e-6, "global backward");
      EXPECT_TRUE(bitwise_equal(ops::pool_backward(pr, dy), dx));
    }

    // With batch_counts (sorted rows, 4 batches, the last empty): B = 4.
    const std::vector<Pt> sorted = {{0, 1, 0, 0}, {0, 5, 5, 5}, {1, 0, 0, 0}, {2, 3, 3, 3}};
    const std::vector<double> sv = {1, 2, 3, 4, 5, 6, 7, 8};
    const SparseTensor xs = make_tensor(sorted, sv, c, dtype, {1, 1, 1}, std::vector<std::int64_t>{2, 1, 1, 0});
    expect_same_values(values(ops::global_sum_pool(xs)), {4, 6, 5, 6, 7, 8, 0, 0}, 0.0, "global sum counts");
    EXPECT_THROW((void)ops::global_max_pool(xs), ValueError);
    const SparseTensor xm = make_tensor(sorted, sv, c, dtype, {1, 1, 1}, std::vector<std::int64_t>{2, 1, 1});
    expect_same_values(values(ops::global_max_pool(xm)), {3, 4, 5, 6, 7, 8}, 0.0, "global max");
  }
}

// pool_transpose3d: fine o = mean of x[i] over the edges o == c_i*s + off_k - p (indexed
// offsets); generated support in first-occurrence order, or onto a target.
TEST(PoolApiTranspose, PoolTransposeMatchesBruteForceAndReference) {
  for (Dtype dtype : {Dtype::f32, Dtype::f64}) {
    const std::int64_t c = 2;
    const auto pts = cloud();
    for (const ops::PoolOptions& o : {ops::PoolOptions{}, ops::PoolOptions{.kernel_size = {3, 3, 3}, .padding = {1, 0, 1}}}) {
      const SparseTensor x = make_tensor(pts, ints(pts.size() * c, 2), c, dtype, {2, 2, 2});
      const std::vector<Pt> tpts = {{0, 0, 0, 0}, {0, 1, 1, 1}, {1, 3, 3, 3}, {0, 40, 0, 0}, {1, 1, 0, 1}};
      const SparseTensor target = make_tensor(tpts, std::vector<double>(tpts.size() * c, 0.0), c, dtype);
      for (const SparseTensor* tp : {static_cast<const SparseTensor*>(nullptr), &target}) {
        const SparseTensor y = ops::pool_transpose3d(x, o, tp);
        const SparseTensor yr = ops::pool_transpose3d(x, with_reference(o), tp);
        const std::vector<Pt> support =
            tp ? tpts : transposed_support(pts, o.kernel_size, o.stride, o.padding, o.dilation);
        EXPECT_EQ(points(y), support);
        EXPECT_EQ(y.stride(), (Int3{1, 1, 1}));
        const auto edges = brute_edges(tp ? RelationKind::transposed_target : RelationKind::transposed, pts, support,
                                       o.kernel_size, o.stride, o.padding, o.dilation);
        ASSERT_FALSE(edges.empty());
        const BrutePool want = brute_pool(PoolMode::avg, edges, support.size(), values(x.feats()), c);
        const double tol = dtype == Dtype::f64 ? 2e-15 : 1e-6;
        expect_same_values(values(y.feats()), want.y, tol, "pool_transpose3d");
        EXPECT_TRUE(bitwise_equal(yr.feats(), y.feats()));

        const ops::PoolPlan plan = ops::plan_pool_transpose("pool_transpose3d", x.coordinate_set(), o,
                                                            tp ? tp->coordinate_set() : std::shared_ptr<CoordinateSet>{});
        const std::vector<double> dyv = ints(support.size() * c, 4);
        const Array dx = ops::pool_backward(plan, make_values(dyv, {static_cast<std::int64_t>(support.size()), c}, dtype));
        expect_same_values(values(dx), brute_pool_backward(PoolMode::avg, edges, want, pts.size(), support.size(), dyv, c),
                           tol, "pool_transpose3d backward");
      }
    }
  }
}

// trilinear_upsample3d, by the formula of pool.h written out here in doubles: per axis
// u = (2f + 1 - r) / (2r), lo = floor(u), t = u - lo, corners lo (1 - t) and lo + 1 (t);
// missing corners and zero weights are dropped and the rest renormalised.
TEST(PoolApiTrilinear, TrilinearUpsampleMatchesFormulaAndReference) {
  for (Dtype dtype : {Dtype::f32, Dtype::f64}) {
    const std::int64_t c = 2;
    const std::vector<Pt> coarse = {{0, 0, 0, 0}, {0, 1, 0, 0}, {0, 0, 1, 1}, {0, 1, 1, 1}, {0, -1, 2, 0}, {1, 0, 0, 0}, {1, 3, 3, 3}};
    const std::vector<double> fv = ints(coarse.size() * c, 7);
    const SparseTensor x = make_tensor(coarse, fv, c, dtype, {4, 4, 4});
    std::map<Pt, std::size_t> row;
    for (std::size_t i = 0; i < coarse.size(); ++i) row[coarse[i]] = i;

    const std::vector<Pt> tpts = {{0, 1, 1, 1}, {0, 2, 2, 3}, {0, 0, 0, 0}, {1, 1, 0, 0}, {0, 30, 30, 30}, {0, -1, 4, 0}};
    const SparseTensor target = make_tensor(tpts, std::vector<double>(tpts.size() * c, 0.0), c, dtype, {2, 2, 2});
    for (const SparseTensor* tp : {static_cast<const SparseTensor*>(nullptr), &target}) {
      const SparseTensor y = ops::trilinear_upsample3d(x, Int3{2, 2, 2}, tp);
      // Without a target: children c*2 + (0..1), first occurrence.
      std::vector<Pt> support;
      if (tp) {
        support = tpts;
      } else {
        std::set<Pt> seen;
        for (const Pt& p : coarse)
          for (int a = 0; a < 2; ++a)
            for (int b = 0; b < 2; ++b)
              for (int d = 0; d < 2; ++d) {
                const Pt q{p.b, p.x * 2 + a, p.y * 2 + b, p.z * 2 + d};
                if (seen.insert(q).second) support.push_back(q);
              }
      }
      EXPECT_EQ(points(y), support);
      EXPECT_EQ(y.stride(), (Int3{2, 2, 2}));
      const int r = 2;
      std::vector<double> want(support.size() * c, 0.0);
      std::vector<std::vector<std::pair<std::size_t, double>>> wts(support.size());
      for (std::size_t f = 0; f < support.size(); ++f) {
        const std::int32_t fc[3] = {support[f].x, support[f].y, support[f].z};
        double t[3];
        std::int32_t lo[3];
        for (int d = 0; d < 3; ++d) {
          const double u = (2.0 * fc[d] + 1 - r) / (2.0 * r);
          lo[d] = static_cast<std::int32_t>(std::floor(u));
          t[d] = u - lo[d];
        }
        double total = 0;
        for (int a = 0; a < 2; ++a)
          for (int b = 0; b < 2; ++b)
            for (int d = 0; d < 2; ++d) {
              const double wgt = (a ? t[0] : 1 - t[0]) * (b ? t[1] : 1 - t[1]) * (d ? t[2] : 1 - t[2]);
              const auto it = row.find(Pt{support[f].b, lo[0] + a, lo[1] + b, lo[2] + d});
              if (wgt == 0 || it == row.end()) continue;
              wts[f].push_back({it->second, wgt});
              total += wgt;
            }
        for (auto& [i, wgt] : wts[f]) {
          wgt /= total;
          for (std::int64_t j = 0; j < c; ++j) want[f * c + j] += wgt * fv[i * c + j];
        }
      }
      const double tol = dtype == Dtype::f64 ? 1e-14 : 1e-6;
      expect_same_values(values(y.feats()), want, tol, "trilinear forward");

      ops::PoolOptions ref{};
      ref.policy.force = RouteId::pool_reference;
      const auto tset = tp ? tp->coordinate_set() : std::shared_ptr<CoordinateSet>{};
      const ops::PoolPlan plan = ops::plan_trilinear_upsample("trilinear_upsample3d", x.coordinate_set(), Int3{2, 2, 2}, tset);
      const ops::PoolPlan pr = ops::plan_trilinear_upsample("trilinear_upsample3d", x.coordinate_set(), Int3{2, 2, 2}, tset, ref);
      EXPECT_TRUE(bitwise_equal(ops::pool_forward(pr, x.feats()).out, y.feats()));
      const std::vector<double> dyv = ints(support.size() * c, 3);
      const Array dy = make_values(dyv, {static_cast<std::int64_t>(support.size()), c}, dtype);
      const Array dx = ops::pool_backward(plan, dy);
      std::vector<double> wdx(coarse.size() * c, 0.0);
      for (std::size_t f = 0; f < support.size(); ++f)
        for (const auto& [i, wgt] : wts[f])
          for (std::int64_t j = 0; j < c; ++j) wdx[i * c + j] += wgt * dyv[f * c + j];
      expect_same_values(values(dx), wdx, tol, "trilinear backward");
      EXPECT_TRUE(bitwise_equal(ops::pool_backward(pr, dy), dx));
    }
  }
}

// ---- validation branches the Python layer cannot reach -----------------------------------------
//
// The Python front end validates most arguments before calling C++, so these branches of src/ops
// are only reachable from the C++ API. Each test checks the whole message
// "[op] argument: expected ..., got ..." and the error kind. Device mismatches use an Array that
// wraps host memory but is labelled cuda:0 (Array::wrap): the checks run before any access, and a
// missing check would surface as a different error or message.

template <class E, class F>
void expect_error(F&& f, const std::string& message) {
  try {
    f();
    ADD_FAILURE() << "no error; expected " << message;
  } catch (const E& e) {
    EXPECT_EQ(std::string(e.what()), message);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong error kind: " << e.what() << "; expected " << message;
  }
}

Array fake_cuda(const Array& a) {
  auto owner = std::make_shared<Array>(a);
  return Array::wrap(a.raw_data(), a.shape(), {}, a.dtype(), Device::cuda(0), owner);
}

SparseTensor validation_input() {
  const auto pts = cloud();  // 12 rows
  return make_tensor(pts, ints(pts.size() * 3, 1), 3, Dtype::f32);
}

TEST(OpsValidation, GeometryOfSubmanifoldAndGenerativeConvs) {
  const SparseTensor x = validation_input();
  const Array w = Array::zeros({27, 3, 2}, Dtype::f32);
  // common.cpp: submanifold stride, generative padding.
  expect_error<ValueError>([&] { ops::subm_conv3d(x, w, {.kernel_size = {3, 3, 3}, .stride = {2, 2, 2}}); },
                           "[subm_conv3d] stride: expected (1, 1, 1) for a submanifold convolution, got (2, 2, 2)");
  const SparseTensor x2 = make_tensor(cloud(), ints(36, 1), 3, Dtype::f32, {2, 2, 2});
  expect_error<ValueError>(
      [&] {
        ops::generative_conv_transpose3d(x2, Array::zeros({8, 3, 2}, Dtype::f32),
                                         {.kernel_size = {2, 2, 2}, .stride = {2, 2, 2}, .padding = {1, 0, 0}});
      },
      "[generative_conv_transpose3d] padding: expected (0, 0, 0) for a generative convolution, got (1, 0, 0)");
}

TEST(OpsValidation, PlanWithoutTargetOrInput) {
  const SparseTensor x = validation_input();
  // common.cpp: a target kind without a target; a null input set (conv and pool planners).
  expect_error<ValueError>([&] { ops::plan_conv("conv3d", RelationKind::target, x, {}, nullptr); },
                           "[conv3d] coordinates: expected a target SparseTensor for a target relation, got None");
  expect_error<ValueError>(
      [&] { ops::plan_conv("conv3d", RelationKind::forward, std::shared_ptr<CoordinateSet>{}, {}, {}); },
      "[conv3d] input: expected a SparseTensor, got an empty SparseTensor");
  expect_error<ValueError>([&] { ops::plan_pool("max_pool3d", PoolMode::max, nullptr, {}); },
                           "[max_pool3d] input: expected a SparseTensor, got an empty SparseTensor");
  expect_error<ValueError>([&] { ops::plan_global_pool("global_max_pool", PoolMode::max, nullptr); },
                           "[global_max_pool] input: expected a SparseTensor, got an empty SparseTensor");
}

TEST(OpsValidation, ConvFeatsAndWeight) {
  const SparseTensor x = validation_input();
  const Array w = Array::zeros({27, 3, 2}, Dtype::f32);
  const ops::ConvPlan plan = ops::plan_conv("conv3d", RelationKind::forward, x, {.kernel_size = {3, 3, 3}});
  // conv.cpp check_weight: missing / integer / wrong-row / wrong-device feats, missing weight.
  expect_error<ValueError>([&] { ops::conv_forward(plan, Array(), w); },
                           "[conv3d] feats: expected an (N, C_in) float array, got nothing");
  expect_error<TypeError>([&] { ops::conv_forward(plan, Array::zeros({12, 3}, Dtype::i32), w); },
                          "[conv3d] feats: expected float16, bfloat16, float32 or float64, got int32");
  expect_error<ValueError>([&] { ops::conv_forward(plan, Array::zeros({5, 3}, Dtype::f32), w); },
                           "[conv3d] feats: expected shape (N_in=12, C_in), got (5, 3)");
  expect_error<ValueError>([&] { ops::conv_forward(plan, fake_cuda(x.feats()), w); },
                           "[conv3d] feats: expected a tensor on cpu (the device of coords), got cuda:0");
  expect_error<ValueError>([&] { ops::conv_forward(plan, x.feats(), Array()); },
                           "[conv3d] weight: expected a weight array, got nothing");
  expect_error<ValueError>([&] { ops::conv_forward(plan, x.feats(), fake_cuda(w)); },
                           "[conv3d] weight: expected a tensor on cpu (the device of feats), got cuda:0");
  expect_error<ValueError>([&] { ops::conv_forward(plan, x.feats(), Array::zeros({27, 3, 2, 1}, Dtype::f32)); },
                           "[conv3d] weight: expected (C_out, 3, 3, 3, C_in=3) or (27, C_in=3, C_out), got (27, 3, 2, 1)");
  const Array b = Array::zeros({2}, Dtype::f32);
  expect_error<ValueError>([&] { ops::conv_forward(plan, x.feats(), w, &(const Array&)fake_cuda(b)); },
                           "[conv3d] bias: expected a tensor on cpu (the device of feats), got cuda:0");
}

TEST(OpsValidation, ConvBackwardGradOut) {
  const SparseTensor x = validation_input();
  const Array w = Array::zeros({27, 3, 2}, Dtype::f32);
  const ops::ConvPlan plan = ops::plan_conv("subm_conv3d", RelationKind::submanifold, x, {.kernel_size = {3, 3, 3}});
  // conv.cpp conv_backward: grad_out missing / wrong dtype / wrong shape / wrong device.
  expect_error<TypeError>([&] { ops::conv_backward(plan, x.feats(), w, Array()); },
                          "[subm_conv3d] grad_out: expected float32 (the dtype of feats), got nothing");
  expect_error<TypeError>([&] { ops::conv_backward(plan, x.feats(), w, Array::zeros({12, 2}, Dtype::f64)); },
                          "[subm_conv3d] grad_out: expected float32 (the dtype of feats), got float64");
  expect_error<ValueError>([&] { ops::conv_backward(plan, x.feats(), w, Array::zeros({12, 3}, Dtype::f32)); },
                           "[subm_conv3d] grad_out: expected shape (N_out=12, C_out=2), got (12, 3)");
  expect_error<ValueError>([&] { ops::conv_backward(plan, x.feats(), w, Array::zeros({12}, Dtype::f32)); },
                           "[subm_conv3d] grad_out: expected shape (N_out=12, C_out=2), got (12,)");
  expect_error<ValueError>(
      [&] { ops::conv_backward(plan, x.feats(), w, fake_cuda(Array::zeros({12, 2}, Dtype::f32))); },
      "[subm_conv3d] grad_out: expected a tensor on cpu (the device of feats), got cuda:0");
}

TEST(OpsValidation, PoolFeatsAndTargets) {
  const SparseTensor x = validation_input();
  const ops::PoolPlan plan = ops::plan_pool("max_pool3d", PoolMode::max, x.coordinate_set(), {});
  // pool.cpp check_features: missing feats / grad_out.
  expect_error<ValueError>([&] { ops::pool_forward(plan, Array()); },
                           "[max_pool3d] feats: expected an (N_in, C) float array, got nothing");
  const ops::PoolPlan sum = ops::plan_pool("sum_pool3d", PoolMode::sum, x.coordinate_set(), {});
  expect_error<ValueError>([&] { ops::pool_backward(sum, Array()); },
                           "[sum_pool3d] grad_out: expected an (N_out, C) float array, got nothing");
}

// pool.cpp plan_trilinear_upsample: a target on another device than the input. A CoordinateSet on
// cuda:0 needs the CUDA backend and a device (SparseTensor refuses device coordinates otherwise),
// so this is the one test here that needs a GPU; it skips only when there is none.
TEST(OpsValidationCuda, TrilinearTargetOnAnotherDevice) {
  const DeviceCaps caps = lattice::device_caps();
  if (!caps.cuda.built || caps.cuda.device_count < 1) GTEST_SKIP() << "needs a CUDA device: " << caps.cuda.status;
  const Array tc = Array::from_vector(std::vector<std::int32_t>{0, 0, 0, 0, 0, 1, 1, 1}, {2, 4});
  const auto target = CoordinateSet::create(tc.to(Device::cuda(0)), {1, 1, 1});
  const SparseTensor coarse = make_tensor({{0, 0, 0, 0}, {0, 1, 1, 1}}, {1, 2}, 1, Dtype::f32, {2, 2, 2});
  expect_error<ValueError>(
      [&] { ops::plan_trilinear_upsample("trilinear_upsample3d", coarse.coordinate_set(), std::nullopt, target); },
      "[trilinear_upsample3d] coordinates: expected the device of the input (cpu), got cuda:0");
}

TEST(OpsValidation, PointsVoxelsAndMasks) {
  // quantize.cpp check_points / checked_batch.
  expect_error<ValueError>([&] { ops::sparse_quantize(Array(), {}); },
                           "[sparse_quantize] points: expected a (P, 3) float array, got nothing");
  const Array pts = Array::from_vector(std::vector<float>{0, 0, 0, 1.5f, 0, 0}, {2, 3});
  const Array batch = Array::from_vector(std::vector<std::int32_t>{0, 0}, {2});
  const Array fb = fake_cuda(batch);
  expect_error<ValueError>([&] { ops::sparse_quantize(pts, {}, &fb); },
                           "[sparse_quantize] batch_indices: expected the device of points (cpu), got cuda:0");
  // point_voxel.cpp check_feats: missing voxelize feats / grad_out, devoxelize feats.
  const ops::PointGrouping g = ops::group_points(pts, {});
  expect_error<ValueError>([&] { ops::voxelize_forward(g, Array(), PointReduction::mean); },
                           "[voxelize] feats: expected an (P, C) float array, got nothing");
  expect_error<ValueError>([&] { ops::voxelize_backward(g, Array(), Array(), PointReduction::mean); },
                           "[voxelize] grad_out: expected an (M, C) float array, got nothing");
  // build_point_voxel_map / devoxelize without voxels.
  expect_error<ValueError>([&] { ops::build_point_voxel_map(pts, nullptr, {}); },
                           "[build_point_voxel_map] voxels: expected a SparseTensor, got an empty SparseTensor");
  const auto map = ops::build_point_voxel_map(pts, g.voxels, {});
  expect_error<ValueError>([&] { ops::devoxelize_forward(*map, nullptr, Array::zeros({2, 1}, Dtype::f32)); },
                           "[devoxelize] voxels: expected a SparseTensor, got an empty SparseTensor");
  expect_error<ValueError>([&] { ops::devoxelize_forward(*map, g.voxels, Array()); },
                           "[devoxelize] feats: expected an (M, C) float array, got nothing");
  // coords.cpp check_mask: prune / from_dense without a mask.
  const Array coords = Array::from_vector(std::vector<std::int32_t>{0, 0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0}, {3, 4});
  expect_error<ValueError>([&] { ops::prune_rows(coords, Array()); },
                           "[prune] mask: expected a bool array of shape (N=3,), got nothing");
  expect_error<ValueError>([&] { ops::nonzero_sites(Array(), {0, 0, 0}); },
                           "[from_dense] dense: expected a bool array of shape (B, X, Y, Z), got nothing");
}

// A valid "linear" packed weight: int4, group 32, C_out = 2, C_in = 32 (4 words per row).
ops::QuantizedWeight linear_weight() {
  ops::QuantizedWeight w;
  w.packed = Array::zeros({2, 4}, Dtype::u32);
  w.scales = Array::zeros({2, 1}, Dtype::f32);
  w.biases = Array::zeros({2, 1}, Dtype::f32);
  w.bits = 4;
  w.group_size = 32;
  w.layout = ops::QuantizedLayout::linear;
  w.shape = {2, 32};
  return w;
}

TEST(OpsValidation, QuantizedWeightFields) {
  const Array x = Array::zeros({3, 32}, Dtype::f32);
  // The valid weight runs (so every error below comes from the one field changed).
  EXPECT_EQ(ops::quantized_linear(x, linear_weight(), nullptr).shape(), (Shape{3, 2}));
  auto with = [&](auto change) {
    ops::QuantizedWeight w = linear_weight();
    change(w);
    return w;
  };
  auto linear = [&](const ops::QuantizedWeight& w) { return [&, w] { ops::quantized_linear(x, w, nullptr); }; };
  using W = ops::QuantizedWeight;
  // quantized.cpp check_quantized, in order.
  expect_error<ValueError>(linear(with([](W& w) { w.bits = 3; })), "[linear] weight: expected bits 4 or 8, got 3");
  expect_error<ValueError>(linear(with([](W& w) { w.group_size = 16; })),
                           "[linear] weight: expected group_size 32, 64 or 128, got 16");
  expect_error<ValueError>(linear(with([](W& w) { w.biases = Array(); })),
                           "[linear] weight: expected packed, scales and biases arrays, got a missing array");
  expect_error<ValueError>(linear(with([](W& w) { w.scales = fake_cuda(w.scales); })),
                           "[linear] weight: expected a tensor on cpu, got cuda:0");
  expect_error<TypeError>(linear(with([](W& w) { w.packed = Array::zeros({2, 4}, Dtype::f32); })),
                          "[linear] weight: expected packed words of int32 or uint32, got float32");
  expect_error<TypeError>(linear(with([](W& w) { w.scales = Array::zeros({2, 1}, Dtype::i32); })),
                          "[linear] weight: expected scales of float16, bfloat16 or float32, got int32");
  expect_error<TypeError>(linear(with([](W& w) { w.biases = Array::zeros({2, 1}, Dtype::f16); })),
                          "[linear] weight: expected biases of the scales' dtype float32, got float16");
  expect_error<ValueError>(linear(with([](W& w) { w.shape = {2, 32, 1}; })),
                           "[linear] weight: expected 2 logical dims for layout 'linear', got (2, 32, 1)");
  expect_error<ValueError>(linear(with([](W& w) { w.shape = {0, 32}; })),
                           "[linear] weight: expected a positive logical shape, got (0, 32)");
  expect_error<ValueError>(linear(with([](W& w) { w.packed = Array::zeros({2, 4, 1}, Dtype::u32); })),
                           "[linear] weight: expected packed words with 2 dims, got (2, 4, 1)");
  expect_error<ValueError>(
      linear(with([](W& w) { w.packed = Array::zeros({2, 2}, Dtype::u32); })),
      "[linear] weight: expected storage channels (packed.shape[1]*32/bits) a multiple of group_size 32 and >= C_in=32, got 16");
  expect_error<ValueError>(linear(with([](W& w) { w.packed = Array::zeros({3, 4}, Dtype::u32); })),
                           "[linear] weight: expected packed words of shape (2, 4), got (3, 4)");
  expect_error<ValueError>(linear(with([](W& w) { w.scales = Array::zeros({2, 2}, Dtype::f32); })),
                           "[linear] weight: expected scales of shape (2, 1), got (2, 2)");
  expect_error<ValueError>(linear(with([](W& w) { w.biases = Array::zeros({2, 2}, Dtype::f32); })),
                           "[linear] weight: expected biases of shape (2, 1), got (2, 2)");
}

TEST(OpsValidation, QuantizedFeatsBiasAndDequantize) {
  const ops::QuantizedWeight w = linear_weight();
  // quantized.cpp check_feats / check_bias.
  expect_error<ValueError>([&] { ops::quantized_linear(Array(), w, nullptr); },
                           "[linear] feats: expected an (N, C_in) float array, got nothing");
  expect_error<ValueError>([&] { ops::quantized_linear(Array::zeros({3, 32, 1}, Dtype::f32), w, nullptr); },
                           "[linear] feats: expected an (N, C_in) array, got (3, 32, 1)");
  const Array x = Array::zeros({3, 32}, Dtype::f32);
  const Array b = fake_cuda(Array::zeros({2}, Dtype::f32));
  expect_error<ValueError>([&] { ops::quantized_linear(x, w, &b); },
                           "[linear] bias: expected the device of feats (cpu), got cuda:0");
  // quantized.cpp check_conv: feats rows and device against the plan.
  const SparseTensor t = make_tensor(cloud(), std::vector<double>(12 * 32, 0.0), 32, Dtype::f32);
  const ops::ConvPlan plan = ops::plan_conv("subm_conv3d", RelationKind::submanifold, t, {.kernel_size = {1, 1, 1}});
  ops::QuantizedWeight km = w;
  km.layout = ops::QuantizedLayout::kernel_major;
  km.shape = {1, 32, 2};
  km.packed = Array::zeros({1, 4, 2}, Dtype::u32);
  km.scales = Array::zeros({1, 1, 2}, Dtype::f32);
  km.biases = Array::zeros({1, 1, 2}, Dtype::f32);
  EXPECT_EQ(ops::quantized_conv_forward(plan, t.feats(), km, nullptr).shape(), (Shape{12, 2}));
  expect_error<ValueError>([&] { ops::quantized_conv_forward(plan, x, km, nullptr); },
                           "[subm_conv3d] feats: expected shape (N_in=12, C_in), got (3, 32)");
  expect_error<ValueError>([&] { ops::quantized_conv_forward(plan, fake_cuda(t.feats()), km, nullptr); },
                           "[subm_conv3d] feats: expected the device of coords (cpu), got cuda:0");
  // quantized.cpp dequantize_kernel_major.
  expect_error<TypeError>([&] { ops::dequantize_kernel_major("linear", w, Dtype::i32); },
                          "[linear] dtype: expected a float dtype, got int32");
  ops::QuantizedWeight no_shape = w;
  no_shape.shape.clear();
  expect_error<ValueError>([&] { ops::dequantize_kernel_major("linear", no_shape, Dtype::f32); },
                           "[linear] weight: expected a logical shape, got ()");
  ops::QuantizedWeight no_packed = w;
  no_packed.packed = Array();
  expect_error<ValueError>([&] { ops::dequantize_kernel_major("linear", no_packed, Dtype::f32); },
                           "[linear] weight: expected packed words, got nothing");
  EXPECT_EQ(ops::dequantize_kernel_major("linear", w, Dtype::f32).shape(), (Shape{1, 32, 2}));
}

}  // namespace
