// CPU convolution routes (src/backend/cpu/conv): the reference route against hand-computed
// numbers, every other route against the reference on random relations (all float dtypes, all
// three passes), reproducibility of gather_gemm_scatter, and the empty relation.
//
// Relations are built by hand: a 1-D line of points with a centered kernel of K offsets, whose
// RelationView arrays are derived from an edge list exactly as the contract in backend/args.h
// describes (output-major list + CSR, per-offset grouping).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/args.h"
#include "backend/cpu/common/fused_rows.h"
#include "backend/kernel_table.h"
#include "lattice/core/dtype.h"
#include "lattice/core/error.h"
#include "lattice/core/threads.h"
#include "lattice/route/route.h"

namespace lattice::backend::cpu {
namespace {

struct Edge {
  std::int32_t i;  // input row
  std::int32_t o;  // output row
  std::int32_t k;  // kernel offset
};

// Owns the arrays behind a RelationView.
struct Relation {
  std::int64_t n_in = 0;
  std::int64_t n_out = 0;
  std::int64_t kernel_volume = 1;
  std::vector<std::int32_t> in_idx{}, out_idx{}, k_idx{}, k_in{}, k_out{}, kt_in{}, kt_out{};
  std::vector<std::int64_t> out_ptr{}, k_ptr{}, in_ptr{};
  bool identity = false;

  RelationView view() const {
    return RelationView{.n_in = n_in,
                        .n_out = n_out,
                        .kernel_volume = kernel_volume,
                        .n_edges = static_cast<std::int64_t>(in_idx.size()),
                        .in_idx = in_idx.data(),
                        .out_idx = out_idx.data(),
                        .k_idx = k_idx.data(),
                        .out_ptr = out_ptr.data(),
                        .k_ptr = k_ptr.data(),
                        .k_in = k_in.data(),
                        .k_out = k_out.data(),
                        .identity = identity,
                        .in_ptr = in_ptr.data(),
                        .kt_in = kt_in.data(),
                        .kt_out = kt_out.data()};
  }
  bool has_edges(std::int64_t o) const { return out_ptr[o + 1] > out_ptr[o]; }
};

// Derives every view of the contract from an edge list (any order, one edge per (o, k)).
Relation make_relation(std::int64_t n_in, std::int64_t n_out, std::int64_t kernel_volume,
                       std::vector<Edge> edges) {
  Relation rel{.n_in = n_in, .n_out = n_out, .kernel_volume = kernel_volume};
  std::sort(edges.begin(), edges.end(),
            [](const Edge& a, const Edge& b) { return a.o != b.o ? a.o < b.o : a.k < b.k; });
  rel.out_ptr.assign(static_cast<std::size_t>(n_out + 1), 0);
  for (const Edge& e : edges) {
    rel.in_idx.push_back(e.i);
    rel.out_idx.push_back(e.o);
    rel.k_idx.push_back(e.k);
    ++rel.out_ptr[e.o + 1];
  }
  std::partial_sum(rel.out_ptr.begin(), rel.out_ptr.end(), rel.out_ptr.begin());
  std::stable_sort(edges.begin(), edges.end(),
                   [](const Edge& a, const Edge& b) { return a.k < b.k; });
  rel.k_ptr.assign(static_cast<std::size_t>(kernel_volume + 1), 0);
  for (const Edge& e : edges) {
    rel.k_in.push_back(e.i);
    rel.k_out.push_back(e.o);
    ++rel.k_ptr[e.k + 1];
  }
  std::partial_sum(rel.k_ptr.begin(), rel.k_ptr.end(), rel.k_ptr.begin());
  // Input-side views: edges per input row, and each offset's edges sorted by input row.
  rel.in_ptr.assign(static_cast<std::size_t>(n_in + 1), 0);
  for (const Edge& e : edges) ++rel.in_ptr[e.i + 1];
  std::partial_sum(rel.in_ptr.begin(), rel.in_ptr.end(), rel.in_ptr.begin());
  std::vector<Edge> by_input = edges;
  std::stable_sort(by_input.begin(), by_input.end(),
                   [](const Edge& a, const Edge& b) { return a.k != b.k ? a.k < b.k : a.i < b.i; });
  for (const Edge& e : by_input) {
    rel.kt_in.push_back(e.i);
    rel.kt_out.push_back(e.o);
  }
  rel.identity = kernel_volume == 1 && n_in == n_out &&
                 static_cast<std::int64_t>(edges.size()) == n_in &&
                 std::all_of(edges.begin(), edges.end(), [](const Edge& e) { return e.i == e.o; });
  return rel;
}

// 1-D lattice: edge (i, o, k) iff in_coords[i] == stride * out_coords[o] + k - K/2.
Relation line_relation(const std::vector<int>& in_coords, const std::vector<int>& out_coords,
                       int kernel_volume, int stride) {
  std::map<int, std::int32_t> row_of;
  for (std::size_t i = 0; i < in_coords.size(); ++i) row_of[in_coords[i]] = std::int32_t(i);
  std::vector<Edge> edges;
  for (std::size_t o = 0; o < out_coords.size(); ++o) {
    for (int k = 0; k < kernel_volume; ++k) {
      auto it = row_of.find(stride * out_coords[o] + k - kernel_volume / 2);
      if (it != row_of.end()) edges.push_back({it->second, std::int32_t(o), k});
    }
  }
  return make_relation(std::ssize(in_coords), std::ssize(out_coords), kernel_volume,
                       std::move(edges));
}

Relation identity_relation(std::int64_t n) {
  std::vector<Edge> edges;
  edges.reserve(static_cast<std::size_t>(n));
  for (std::int32_t r = 0; r < n; ++r) edges.push_back({r, r, 0});
  return make_relation(n, n, 1, std::move(edges));
}

// `count` distinct values from [lo, hi), in random order.
std::vector<int> distinct_coords(int count, int lo, int hi, std::mt19937& gen) {
  std::vector<int> all(static_cast<std::size_t>(hi - lo));
  std::iota(all.begin(), all.end(), lo);
  std::shuffle(all.begin(), all.end(), gen);
  all.resize(static_cast<std::size_t>(count));
  return all;
}

// Tolerances relative to max|ref| (SEMANTICS.md "Numerics and determinism").
template <class T>
constexpr double kTol = 0;
template <>
constexpr double kTol<Half> = 2e-3;
template <>
constexpr double kTol<BFloat16> = 1e-2;
template <>
constexpr double kTol<float> = 1e-5;
template <>
constexpr double kTol<double> = 1e-12;

template <class T>
double as_double(T v) {
  return static_cast<double>(load(v));
}

template <class T>
std::vector<T> from_doubles(const std::vector<double>& values) {
  std::vector<T> out;
  out.reserve(values.size());
  for (double v : values) out.push_back(store<T>(static_cast<Accum<T>>(v)));
  return out;
}

template <class T>
std::vector<T> random_values(std::int64_t count, std::mt19937& gen) {
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<double> values(static_cast<std::size_t>(count));
  for (double& v : values) v = dist(gen);
  return from_doubles<T>(values);
}

// Inputs of all three passes (canonical weight layout (K, C_in, C_out)).
template <class T>
struct ConvData {
  std::int64_t c_in = 0;
  std::int64_t c_out = 0;
  std::vector<T> x{}, w{}, bias{}, dy{};  // bias empty = no bias
};

template <class T>
ConvData<T> random_data(const Relation& rel, std::int64_t c_in, std::int64_t c_out, bool with_bias,
                        std::mt19937& gen) {
  ConvData<T> d{.c_in = c_in, .c_out = c_out};
  d.x = random_values<T>(rel.n_in * c_in, gen);
  d.w = random_values<T>(rel.kernel_volume * c_in * c_out, gen);
  if (with_bias) d.bias = random_values<T>(c_out, gen);
  d.dy = random_values<T>(rel.n_out * c_out, gen);
  return d;
}

template <class T>
struct ConvOutputs {
  std::vector<T> y, dx, dw;
};

using PassFn = void (*)(const ConvArgs&);
struct Route {
  const char* name;
  PassFn forward;
  PassFn input_grad;
  PassFn weight_grad;
};
// Each route's passes as its kernel file registered them (LATTICE_ROUTE_KERNELS), read through
// the kernel table the semantic layer calls.
Route route_of(const char* name, RouteId id) {
  const ConvKernels* k = find_conv_kernels(id);
  if (k == nullptr) throw InternalError(std::string("no kernels registered for conv route ") + name);
  return {name, k->forward, k->input_grad, k->weight_grad};
}
const Route kReference = route_of("reference", RouteId::conv_reference);
const Route kPointwiseMatmul = route_of("pointwise_matmul", RouteId::conv_pointwise_matmul);
const Route kGatherGemmScatter = route_of("gather_gemm_scatter", RouteId::conv_gather_gemm_scatter);

// Runs the three passes of `route`; outputs start as NaN, so a route must overwrite them fully.
template <class T>
ConvOutputs<T> run(const Route& route, const Relation& rel, const ConvData<T>& d) {
  const T nan = store<T>(std::numeric_limits<Accum<T>>::quiet_NaN());
  ConvOutputs<T> out;
  out.y.assign(static_cast<std::size_t>(rel.n_out * d.c_out), nan);
  out.dx.assign(static_cast<std::size_t>(rel.n_in * d.c_in), nan);
  out.dw.assign(static_cast<std::size_t>(rel.kernel_volume * d.c_in * d.c_out), nan);
  ConvArgs args{.dtype = dtype_of<T>(),
                .rel = rel.view(),
                .c_in = d.c_in,
                .c_out = d.c_out,
                .x = d.x.data(),
                .w = d.w.data(),
                .bias = d.bias.empty() ? nullptr : d.bias.data(),
                .y = out.y.data(),
                .dy = d.dy.data(),
                .dx = out.dx.data(),
                .dw = out.dw.data()};
  route.forward(args);
  route.input_grad(args);
  route.weight_grad(args);
  return out;
}

template <class T>
std::vector<double> to_doubles(const std::vector<T>& values) {
  std::vector<double> out;
  out.reserve(values.size());
  for (T v : values) out.push_back(as_double(v));
  return out;
}

// max|got - ref| <= tol * max|ref| (an all-zero ref must be matched exactly); no NaN anywhere.
template <class T>
void expect_close(const std::vector<T>& got, const std::vector<T>& ref, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  double max_ref = 0;
  double max_diff = 0;
  for (std::size_t j = 0; j < ref.size(); ++j) {
    const double g = as_double(got[j]);
    const double r = as_double(ref[j]);
    ASSERT_FALSE(std::isnan(g)) << what << " element " << j << " is NaN";
    max_ref = std::max(max_ref, std::abs(r));
    max_diff = std::max(max_diff, std::abs(g - r));
  }
  EXPECT_LE(max_diff, kTol<T> * max_ref) << what << " (max|ref| = " << max_ref << ")";
}

template <class T>
void expect_bitwise_equal(const std::vector<T>& a, const std::vector<T>& b,
                          const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(T)), 0) << what;
}

// --- Hand-computed case ---------------------------------------------------------------------
//
// n_in = 3, n_out = 3, K = 3, C_in = C_out = 2. Edges (i, o, k):
//   (0, 0, 1), (1, 0, 2), (2, 1, 0), (1, 1, 1); output row 2 has no edges.
// x = [[1, 2], [3, 4], [5, 6]]
// W[0] = [[1, 0], [0, 1]], W[1] = [[1, 1], [0, 0]], W[2] = [[0, 0], [1, -1]]   (C_in rows)
// bias = [10, 20]; dy = [[1, 0], [0, 1], [7, 7]]
//
// y[0] = bias + x0 W1 + x1 W2 = [10, 20] + [1, 1] + [4, -4] = [15, 17]
// y[1] = bias + x2 W0 + x1 W1 = [10, 20] + [5, 6] + [3, 3]  = [18, 29]
// y[2] = bias                                               = [10, 20]
// dx[0] = dy0 W1^T = [1, 0]; dx[1] = dy0 W2^T + dy1 W1^T = [0, 1] + [1, 0] = [1, 1];
// dx[2] = dy1 W0^T = [0, 1]
// dW[0] = x2^T dy1 = [[0, 5], [0, 6]]
// dW[1] = x0^T dy0 + x1^T dy1 = [[1, 0], [2, 0]] + [[0, 3], [0, 4]] = [[1, 3], [2, 4]]
// dW[2] = x1^T dy0 = [[3, 0], [4, 0]]
// Every number is an exact small integer, so every dtype must reproduce them exactly.
Relation hand_relation() {
  return make_relation(3, 3, 3, {{0, 0, 1}, {1, 0, 2}, {2, 1, 0}, {1, 1, 1}});
}

template <class T>
ConvData<T> hand_data() {
  return ConvData<T>{.c_in = 2,
                     .c_out = 2,
                     .x = from_doubles<T>({1, 2, 3, 4, 5, 6}),
                     .w = from_doubles<T>({1, 0, 0, 1, 1, 1, 0, 0, 0, 0, 1, -1}),
                     .bias = from_doubles<T>({10, 20}),
                     .dy = from_doubles<T>({1, 0, 0, 1, 7, 7})};
}

const std::vector<double> kHandY = {15, 17, 18, 29, 10, 20};
const std::vector<double> kHandDx = {1, 0, 1, 1, 0, 1};
const std::vector<double> kHandDw = {0, 5, 0, 6, 1, 3, 2, 4, 3, 0, 4, 0};

struct DtypeName {
  template <class T>
  static std::string GetName(int) {
    return std::string(to_string(dtype_of<T>()));
  }
};
using FloatTypes = ::testing::Types<Half, BFloat16, float, double>;

template <class T>
class ConvReference : public ::testing::Test {};
TYPED_TEST_SUITE(ConvReference, FloatTypes, DtypeName);

TYPED_TEST(ConvReference, ForwardSumsEdgesPlusBias) {
  const auto out = run(kReference, hand_relation(), hand_data<TypeParam>());
  EXPECT_EQ(to_doubles(out.y), kHandY);
}

TYPED_TEST(ConvReference, InputGradSumsTransposedWeightOverEdges) {
  const auto out = run(kReference, hand_relation(), hand_data<TypeParam>());
  EXPECT_EQ(to_doubles(out.dx), kHandDx);
}

TYPED_TEST(ConvReference, WeightGradSumsOuterProductsPerOffset) {
  const auto out = run(kReference, hand_relation(), hand_data<TypeParam>());
  EXPECT_EQ(to_doubles(out.dw), kHandDw);
}

TYPED_TEST(ConvReference, RowsWithoutEdgesGetZeroWithoutBias) {
  auto data = hand_data<TypeParam>();
  data.bias.clear();
  const auto out = run(kReference, hand_relation(), data);
  EXPECT_EQ(to_doubles(out.y), (std::vector<double>{5, -3, 8, 9, 0, 0}));
}

TEST(ConvReference, NonFloatDtypeRaisesTypeError) {
  const Relation rel = hand_relation();
  const ConvArgs args{.dtype = Dtype::i32, .rel = rel.view(), .c_in = 2, .c_out = 2};
  EXPECT_THROW(kReference.forward(args), TypeError);
  EXPECT_THROW(kGatherGemmScatter.forward(args), TypeError);
}

// --- Routes against the reference -----------------------------------------------------------

struct RandomCase {
  int n_in;
  int n_out;
  int kernel_volume;
  int stride;
  std::int64_t c_in;
  std::int64_t c_out;
  bool bias;
};

// Input points fill half of [0, 2 n_in); output points range a little past the input's reach,
// so some output rows have no edges.
Relation random_line_relation(const RandomCase& c, std::mt19937& gen) {
  const int span = 2 * c.n_in;
  return line_relation(distinct_coords(c.n_in, 0, span, gen),
                       distinct_coords(c.n_out, -2, span / c.stride + 2, gen), c.kernel_volume,
                       c.stride);
}

const std::vector<RandomCase> kRandomCases = {
    // n_in, n_out, K, stride, C_in, C_out, bias
    {1, 3, 1, 1, 1, 1, true},        {7, 5, 3, 1, 3, 4, true},      {40, 25, 5, 2, 8, 3, true},
    {120, 90, 27, 1, 16, 24, false}, {300, 200, 7, 2, 5, 33, true},
};

std::string describe(const RandomCase& c) {
  return "n_in=" + std::to_string(c.n_in) + " n_out=" + std::to_string(c.n_out) +
         " K=" + std::to_string(c.kernel_volume) + " C_in=" + std::to_string(c.c_in) +
         " C_out=" + std::to_string(c.c_out);
}

template <class T>
void expect_route_matches_reference(const Route& route, const Relation& rel,
                                    const ConvData<T>& data, const std::string& what) {
  const auto ref = run(kReference, rel, data);
  const auto got = run(route, rel, data);
  expect_close(got.y, ref.y, std::string(route.name) + " y, " + what);
  expect_close(got.dx, ref.dx, std::string(route.name) + " dx, " + what);
  expect_close(got.dw, ref.dw, std::string(route.name) + " dw, " + what);
}

template <class T>
class ConvGatherGemmScatter : public ::testing::Test {};
TYPED_TEST_SUITE(ConvGatherGemmScatter, FloatTypes, DtypeName);

TYPED_TEST(ConvGatherGemmScatter, HandCaseIsExact) {
  const auto out = run(kGatherGemmScatter, hand_relation(), hand_data<TypeParam>());
  EXPECT_EQ(to_doubles(out.y), kHandY);
  EXPECT_EQ(to_doubles(out.dx), kHandDx);
  EXPECT_EQ(to_doubles(out.dw), kHandDw);
}

TYPED_TEST(ConvGatherGemmScatter, MatchesReferenceOnRandomRelations) {
  std::mt19937 gen(1234);
  for (const RandomCase& c : kRandomCases) {
    const Relation rel = random_line_relation(c, gen);
    const auto data = random_data<TypeParam>(rel, c.c_in, c.c_out, c.bias, gen);
    expect_route_matches_reference(kGatherGemmScatter, rel, data, describe(c));
  }
}

TYPED_TEST(ConvGatherGemmScatter, RowsWithoutEdgesGetBias) {
  std::mt19937 gen(99);
  const RandomCase c = kRandomCases[2];
  const Relation rel = random_line_relation(c, gen);
  const auto data = random_data<TypeParam>(rel, c.c_in, c.c_out, true, gen);
  const auto out = run(kGatherGemmScatter, rel, data);
  int rows_without_edges = 0;
  for (std::int64_t o = 0; o < rel.n_out; ++o) {
    if (rel.has_edges(o)) continue;
    ++rows_without_edges;
    for (std::int64_t co = 0; co < c.c_out; ++co) {
      EXPECT_EQ(as_double(out.y[o * c.c_out + co]), as_double(data.bias[co])) << "row " << o;
    }
  }
  EXPECT_GT(rows_without_edges, 0) << "the case should contain output rows without edges";
}

TYPED_TEST(ConvGatherGemmScatter, BitwiseReproducibleAcrossRunsAndThreadCounts) {
  std::mt19937 gen(7);
  const RandomCase c{3000, 2500, 27, 1, 32, 48, true};  // n_in, n_out, K, stride, C_in, C_out
  const Relation rel = random_line_relation(c, gen);
  const auto data = random_data<TypeParam>(rel, c.c_in, c.c_out, c.bias, gen);
  const auto first = run(kGatherGemmScatter, rel, data);
  const auto second = run(kGatherGemmScatter, rel, data);
  const int threads = num_threads();
  set_num_threads(threads == 1 ? 3 : 1);
  const auto other_threads = run(kGatherGemmScatter, rel, data);
  set_num_threads(threads);
  for (const auto* out : {&second, &other_threads}) {
    const std::string what = out == &second ? "second run" : "other thread count";
    expect_bitwise_equal(first.y, out->y, "y, " + what);
    expect_bitwise_equal(first.dx, out->dx, "dx, " + what);
    expect_bitwise_equal(first.dw, out->dw, "dw, " + what);
  }
}

// A submanifold relation (outputs == inputs, centred kernel): its centre offset is (i, i) for
// every row, so whole blocks of consecutive rows take the in-place GEMM path (no gather, no
// scatter) of forward, input_grad and weight_grad, next to gathered blocks of the other offsets.
// Checked against the reference and for bitwise equality across thread counts; C_in = 300 also
// spans two of BLIS's inner panels (kc = 256) inside one in-place call.
TYPED_TEST(ConvGatherGemmScatter, SubmanifoldCentreRunsInPlaceMatchReference) {
  std::mt19937 gen(5);
  for (const auto& [n, c_in, c_out] : {std::tuple{3000, 40, 24}, std::tuple{400, 300, 9}}) {
    std::vector<int> coords = distinct_coords(n, 0, 2 * n, gen);
    std::sort(coords.begin(), coords.end());
    const Relation rel = line_relation(coords, coords, 5, 1);
    const auto data = random_data<TypeParam>(rel, c_in, c_out, true, gen);
    const std::string what = "n=" + std::to_string(n) + " C_in=" + std::to_string(c_in);
    expect_route_matches_reference(kGatherGemmScatter, rel, data, what);
    const auto first = run(kGatherGemmScatter, rel, data);
    const int threads = num_threads();
    set_num_threads(threads == 1 ? 3 : 1);
    const auto other = run(kGatherGemmScatter, rel, data);
    set_num_threads(threads);
    expect_bitwise_equal(first.y, other.y, "y, other thread count, " + what);
    expect_bitwise_equal(first.dx, other.dx, "dx, other thread count, " + what);
    expect_bitwise_equal(first.dw, other.dw, "dw, other thread count, " + what);
  }
}

// f32 forward, input_grad and weight_grad of gather_gemm_scatter take the fused AVX + FMA
// kernels (backend/cpu/common/fused_rows.h: rows read in place, W[k] packed once per call; the
// weight gradient in edge blocks of 16-256 edges) on CPUs that have them, and the BLIS gather/GEMM/scatter path elsewhere (f16/bf16/f64 always take BLIS).
// The typed tests above hold whichever path this machine takes for f32; this one switches the
// fused kernel off and on around the same problems, so both f32 paths are checked against the
// reference, and each for bitwise equality across runs and thread counts, on any CPU with AVX and FMA.
// The shapes include column tails of the 16-column panels (C_out 1, 3, 4, 9, 24, 33, 48) and row
// ranges that are not multiples of the 6-row tile; the submanifold case has long consecutive runs.
TEST(ConvGatherGemmScatterF32, FusedAndBlisPathsMatchReferenceAndAreReproducible) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (__builtin_cpu_supports("avx") && __builtin_cpu_supports("fma")) {
    ASSERT_TRUE(detail::fused_rows_available()) << "an AVX + FMA CPU (AVX2 or not) must take the fused f32 path";
  }
#endif
  struct Restore {
    ~Restore() { detail::set_fused_rows_enabled(true); }
  } restore;
  for (const bool fused : {false, true}) {
    detail::set_fused_rows_enabled(fused);
    const std::string path = fused && detail::fused_rows_available() ? "fused" : "blis";
    if (!fused) {
      ASSERT_FALSE(detail::fused_rows_available()) << "the switch must turn the fused path off";
    }
    std::mt19937 gen(1234);
    for (const RandomCase& c : kRandomCases) {
      const Relation rel = random_line_relation(c, gen);
      const auto data = random_data<float>(rel, c.c_in, c.c_out, c.bias, gen);
      expect_route_matches_reference(kGatherGemmScatter, rel, data, path + ", " + describe(c));
    }
    std::vector<int> coords = distinct_coords(2000, 0, 4000, gen);
    std::sort(coords.begin(), coords.end());
    const std::vector<std::pair<Relation, RandomCase>> problems = {
        {random_line_relation(RandomCase{3000, 2500, 27, 1, 32, 48, true}, gen), {3000, 2500, 27, 1, 32, 48, true}},
        {line_relation(coords, coords, 5, 1), {2000, 2000, 5, 1, 40, 9, true}}};
    for (const auto& [rel, c] : problems) {
      const auto data = random_data<float>(rel, c.c_in, c.c_out, c.bias, gen);
      const std::string what = path + ", " + describe(c);
      expect_route_matches_reference(kGatherGemmScatter, rel, data, what);
      const auto first = run(kGatherGemmScatter, rel, data);
      const auto second = run(kGatherGemmScatter, rel, data);
      const int threads = num_threads();
      set_num_threads(threads == 1 ? 3 : 1);
      const auto other = run(kGatherGemmScatter, rel, data);
      set_num_threads(threads);
      for (const auto* out : {&second, &other}) {
        const std::string run_what = what + (out == &second ? ", second run" : ", other thread count");
        expect_bitwise_equal(first.y, out->y, "y, " + run_what);
        expect_bitwise_equal(first.dx, out->dx, "dx, " + run_what);
        expect_bitwise_equal(first.dw, out->dw, "dw, " + run_what);
      }
    }
  }
}

template <class T>
class ConvPointwiseMatmul : public ::testing::Test {};
TYPED_TEST_SUITE(ConvPointwiseMatmul, FloatTypes, DtypeName);

TYPED_TEST(ConvPointwiseMatmul, MatchesReferenceOnIdentityRelation) {
  std::mt19937 gen(42);
  struct Sizes {
    std::int64_t n, c_in, c_out;
    bool bias;
  };
  for (const Sizes s : {Sizes{1, 3, 5, true}, Sizes{17, 16, 8, false}, Sizes{256, 33, 7, true}}) {
    const Relation rel = identity_relation(s.n);
    ASSERT_TRUE(rel.identity);
    const auto data = random_data<TypeParam>(rel, s.c_in, s.c_out, s.bias, gen);
    const std::string what = "n=" + std::to_string(s.n);
    expect_route_matches_reference(kPointwiseMatmul, rel, data, what);
    expect_route_matches_reference(kGatherGemmScatter, rel, data, what);
  }
}

// The pointwise route's f32 passes take the fused register-tile kernels on an AVX + FMA CPU
// (issue 17) and BLIS otherwise. This switches the fused kernels off and on around the same
// identity problems, so both paths are checked against the reference, and each for bitwise
// equality across runs and thread counts. The shapes cover several row blocks of the fused
// passes (1536 rows each) with a partial last block and a partial last 6-row tile, 16-column
// panel tails on both sides (C_out 33 and C_in 40 for W^T in the input gradient), C_in below
// one tile row (7), a single row, and C_in split into weight-gradient column blocks.
TEST(ConvPointwiseMatmulF32, FusedAndBlisPathsMatchReferenceAndAreReproducible) {
  struct Restore {
    ~Restore() { detail::set_fused_rows_enabled(true); }
  } restore;
  struct Sizes {
    std::int64_t n, c_in, c_out;
    bool bias;
  };
  for (const bool fused : {false, true}) {
    detail::set_fused_rows_enabled(fused);
    const std::string path = fused && detail::fused_rows_available() ? "fused" : "blis";
    std::mt19937 gen(77);
    for (const Sizes s : {Sizes{4001, 40, 33, true}, Sizes{3073, 7, 48, false}, Sizes{1, 5, 3, true},
                          Sizes{1600, 96, 128, true}}) {
      const Relation rel = identity_relation(s.n);
      const auto data = random_data<float>(rel, s.c_in, s.c_out, s.bias, gen);
      const std::string what = path + ", n=" + std::to_string(s.n) + " C_in=" + std::to_string(s.c_in) +
                               " C_out=" + std::to_string(s.c_out);
      expect_route_matches_reference(kPointwiseMatmul, rel, data, what);
      const auto first = run(kPointwiseMatmul, rel, data);
      const auto second = run(kPointwiseMatmul, rel, data);
      const int threads = num_threads();
      set_num_threads(threads == 1 ? 3 : 1);
      const auto other = run(kPointwiseMatmul, rel, data);
      set_num_threads(threads);
      for (const auto* out : {&second, &other}) {
        const std::string run_what = what + (out == &second ? ", second run" : ", other thread count");
        expect_bitwise_equal(first.y, out->y, "y, " + run_what);
        expect_bitwise_equal(first.dx, out->dx, "dx, " + run_what);
        expect_bitwise_equal(first.dw, out->dw, "dw, " + run_what);
      }
    }
  }
}

TEST(ConvPointwiseMatmul, NonIdentityRelationIsAnInternalError) {
  const Relation rel = hand_relation();
  const auto data = hand_data<float>();
  EXPECT_THROW(run(kPointwiseMatmul, rel, data), InternalError);
}

// --- Empty relation -------------------------------------------------------------------------

template <class T>
class ConvRoutes : public ::testing::Test {};
TYPED_TEST_SUITE(ConvRoutes, FloatTypes, DtypeName);

TYPED_TEST(ConvRoutes, EmptyRelationGivesBiasAndZeroGrads) {
  using T = TypeParam;
  std::mt19937 gen(5);
  const Relation rel = make_relation(4, 3, 3, {});
  const auto data = random_data<T>(rel, 2, 3, true, gen);
  for (const Route& route : {kReference, kGatherGemmScatter}) {
    const auto out = run(route, rel, data);
    std::vector<double> bias_rows;
    for (int o = 0; o < 3; ++o) {
      for (T b : data.bias) bias_rows.push_back(as_double(b));
    }
    EXPECT_EQ(to_doubles(out.y), bias_rows) << route.name;
    // dx is (n_in=4, C_in=2), dw (K=3, C_in=2, C_out=3).
    EXPECT_EQ(to_doubles(out.dx), std::vector<double>(8, 0.0)) << route.name;
    EXPECT_EQ(to_doubles(out.dw), std::vector<double>(18, 0.0)) << route.name;
  }
}

TYPED_TEST(ConvRoutes, EmptyIdentityRelationGivesZeroWeightGrad) {
  std::mt19937 gen(6);
  const Relation rel = identity_relation(0);
  const auto data = random_data<TypeParam>(rel, 4, 2, true, gen);
  for (const Route& route : {kReference, kPointwiseMatmul, kGatherGemmScatter}) {
    const auto out = run(route, rel, data);
    EXPECT_TRUE(out.y.empty() && out.dx.empty()) << route.name;
    EXPECT_EQ(to_doubles(out.dw), std::vector<double>(8, 0.0)) << route.name;  // (1, 4, 2)
  }
}

}  // namespace
}  // namespace lattice::backend::cpu
