// Coordinate sets and relations on a CUDA device (src/backend/cuda/relation/hash.cu):
// every relation kind built on cuda:0 must be bitwise equal to the CPU build from the same
// coordinates (every array: edge lists, CSR pointers, per-offset grouping, gemm map, row masks,
// input grouping; the generated output support with its stride and batch counts), and errors
// (duplicate rows, int32 overflow of generated coordinates, bad batch ids) must read the same.
// Skipped, with the reason printed, when no CUDA device is available.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backend/kernel_table.h"
#include "cuda_test_support.h"
#include "lattice/core/array.h"
#include "lattice/core/dlpack.h"
#include "lattice/core/error.h"
#include "lattice/ops/conv.h"
#include "lattice/ops/pool.h"
#include "lattice/tensor/coordinate_set.h"
#include "lattice/tensor/relation.h"

namespace lattice {
namespace {

using Row = std::array<std::int32_t, 4>;

using cuda_test::kGpu;

// When set, a zero-row coordinate array is made with these strides (and no storage), as torch
// hands them over through DLPack: torch.from_numpy of an empty (0, 4) array has strides (0, 0),
// its DLPack export (1, 0) (dims of size < 2 get stride 1).
const Shape* g_zero_row_strides = nullptr;

struct ZeroRowStrides {
  explicit ZeroRowStrides(const Shape& strides) : strides_(strides) { g_zero_row_strides = &strides_; }
  ~ZeroRowStrides() { g_zero_row_strides = nullptr; }
  Shape strides_;
};

Array coords_array(const std::vector<Row>& rows, Device device) {
  if (rows.empty() && g_zero_row_strides) {
    return Array::wrap(nullptr, {0, 4}, *g_zero_row_strides, Dtype::i32, device, nullptr);
  }
  std::vector<std::int32_t> flat;
  for (const Row& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  const Array host = Array::from_vector<std::int32_t>(flat, {static_cast<std::int64_t>(rows.size()), 4});
  return device.is_cpu() ? host : host.to(device);
}

std::shared_ptr<CoordinateSet> make_set(const std::vector<Row>& rows, Device device, Int3 stride = {1, 1, 1},
                                        std::optional<std::vector<std::int64_t>> batch_counts = {},
                                        bool validate = false) {
  return CoordinateSet::create(coords_array(rows, device), stride, std::move(batch_counts), validate);
}

KernelSpec spec_of(Int3 size, Int3 stride = {1, 1, 1}, Int3 padding = {0, 0, 0}, Int3 dilation = {1, 1, 1},
                   bool expand = false) {
  KernelSpec spec;
  spec.size = size;
  spec.stride = stride;
  spec.padding = padding;
  spec.dilation = dilation;
  spec.expand = expand;
  return spec;
}

Int3 cube(std::int32_t v) { return {v, v, v}; }

// Unique random rows (batch in [0, batches), x, y, z in [lo, hi]) in random order.
std::vector<Row> random_rows(std::int64_t n, std::int32_t batches, std::int32_t lo, std::int32_t hi,
                             std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<std::int32_t> coord(lo, hi);
  std::uniform_int_distribution<std::int32_t> batch(0, batches - 1);
  std::set<Row> seen;
  std::vector<Row> rows;
  while (static_cast<std::int64_t>(rows.size()) < n) {
    const Row r{batch(gen), coord(gen), coord(gen), coord(gen)};
    if (seen.insert(r).second) rows.push_back(r);
  }
  return rows;
}

std::vector<std::int64_t> counts_of(const std::vector<Row>& rows, std::int32_t batches) {
  std::vector<std::int64_t> counts(static_cast<std::size_t>(batches), 0);
  for (const Row& r : rows) ++counts[static_cast<std::size_t>(r[0])];
  return counts;
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
  if (std::memcmp(back.raw_data(), want.raw_data(), want.nbytes()) != 0) {
    // Name the first differing element (all relation arrays are int32 or int64).
    const std::size_t es = size_of(want.dtype());
    for (std::int64_t i = 0; i < want.numel(); ++i) {
      if (std::memcmp(static_cast<const char*>(back.raw_data()) + i * es,
                      static_cast<const char*>(want.raw_data()) + i * es, es) != 0) {
        const std::int64_t g = es == 4 ? back.data<std::int32_t>()[i] : back.data<std::int64_t>()[i];
        const std::int64_t c = es == 4 ? want.data<std::int32_t>()[i] : want.data<std::int64_t>()[i];
        ADD_FAILURE() << what << ": element " << i << " is " << g << " on cuda:0, " << c << " on the CPU";
        return;
      }
    }
  }
}

// Every view, built on request on each device (lattice/tensor/relation.h "Views"). A fresh pair
// first shows the same views and known count right after the build (the map alone, plus the count
// where the geometry fixes it). `grouping_first`: the device relation is first asked for its
// per-offset grouping, which finds an unknown count itself (one k_ptr read-back that also gives
// host_k_ptr) instead of counting the map (device_count_edges).
void expect_same_relation(const Relation& cpu, const Relation& gpu, const std::string& what,
                          bool fresh = false, bool grouping_first = false) {
  if (fresh) {
    EXPECT_EQ(gpu.built_views(), cpu.built_views()) << what << " views at build";
    EXPECT_EQ(gpu.known_edges(), cpu.known_edges()) << what << " count at build";
    EXPECT_EQ(gpu.view_bytes(), cpu.view_bytes()) << what << " bytes at build";
  }
  if (grouping_first) {
    expect_same_array(cpu.k_ptr(), gpu.k_ptr(), what + " k_ptr (first)");
    EXPECT_EQ(gpu.known_edges(), cpu.n_edges()) << what << " count from the grouping";
    EXPECT_EQ(gpu.host_k_ptr(), cpu.host_k_ptr()) << what << " host_k_ptr";
  }
  EXPECT_EQ(gpu.kind, cpu.kind) << what;
  EXPECT_EQ(gpu.spec, cpu.spec) << what;
  EXPECT_EQ(gpu.n_in, cpu.n_in) << what;
  EXPECT_EQ(gpu.n_out, cpu.n_out) << what;
  EXPECT_EQ(gpu.kernel_volume, cpu.kernel_volume) << what;
  EXPECT_EQ(gpu.n_edges(), cpu.n_edges()) << what;
  EXPECT_EQ(gpu.host_k_ptr(), cpu.host_k_ptr()) << what << " host_k_ptr";
  expect_same_array(cpu.input_gemm_map(), gpu.input_gemm_map(), what + " input_gemm_map");
  ASSERT_EQ(gpu.gemm_order().defined(), cpu.gemm_order().defined()) << what;
  if (cpu.gemm_order().defined()) expect_same_array(cpu.gemm_order(), gpu.gemm_order(), what + " gemm_order");
  ASSERT_EQ(gpu.input_gemm_order().defined(), cpu.input_gemm_order().defined()) << what;
  if (cpu.input_gemm_order().defined())
    expect_same_array(cpu.input_gemm_order(), gpu.input_gemm_order(), what + " input_gemm_order");
  EXPECT_EQ(gpu.identity, cpu.identity) << what;
  expect_same_array(cpu.in_idx(), gpu.in_idx(), what + " in_idx");
  expect_same_array(cpu.out_idx(), gpu.out_idx(), what + " out_idx");
  expect_same_array(cpu.k_idx(), gpu.k_idx(), what + " k_idx");
  expect_same_array(cpu.out_ptr(), gpu.out_ptr(), what + " out_ptr");
  expect_same_array(cpu.k_ptr(), gpu.k_ptr(), what + " k_ptr");
  expect_same_array(cpu.k_in(), gpu.k_in(), what + " k_in");
  expect_same_array(cpu.k_out(), gpu.k_out(), what + " k_out");
  expect_same_array(cpu.gemm_map(), gpu.gemm_map(), what + " gemm_map");
  expect_same_array(cpu.row_masks(), gpu.row_masks(), what + " row_masks");
  const Relation::InputGrouping& ci = cpu.input_grouping();
  const Relation::InputGrouping& gi = gpu.input_grouping();
  expect_same_array(ci.in_ptr, gi.in_ptr, what + " in_ptr");
  expect_same_array(ci.kt_in, gi.kt_in, what + " kt_in");
  expect_same_array(ci.kt_out, gi.kt_out, what + " kt_out");
}

struct Case {
  std::string name;
  RelationKind kind;
  KernelSpec spec;
  Int3 input_stride{1, 1, 1};
};

// Builds `c` from the same rows on the CPU and on cuda:0 and compares everything. The target
// (target kinds) is `target_rows` at the output stride.
void check_case(const Case& c, const std::vector<Row>& rows, std::int32_t batches,
                const std::vector<Row>& target_rows = {}) {
  SCOPED_TRACE(c.name);
  const bool onto_target = c.kind == RelationKind::target || c.kind == RelationKind::transposed_target;
  std::optional<std::vector<std::int64_t>> counts;
  if (batches > 0) counts = counts_of(rows, batches);
  auto cpu_in = make_set(rows, Device::cpu(), c.input_stride, counts);
  auto gpu_in = make_set(rows, kGpu, c.input_stride, counts);
  EXPECT_EQ(gpu_in->coords().device(), kGpu);

  std::shared_ptr<CoordinateSet> cpu_target, gpu_target;
  if (onto_target) {
    Int3 out_stride{};
    for (int a = 0; a < 3; ++a) {
      out_stride[a] = c.kind == RelationKind::target ? c.input_stride[a] * c.spec.stride[a]
                                                     : c.input_stride[a] / c.spec.stride[a];
    }
    cpu_target = make_set(target_rows, Device::cpu(), out_stride);
    gpu_target = make_set(target_rows, kGpu, out_stride);
  }
  const auto cpu = cpu_in->relation(c.kind, c.spec, cpu_target, "test");
  const auto gpu = gpu_in->relation(c.kind, c.spec, gpu_target, "test");
  expect_same_relation(*cpu.relation, *gpu.relation, c.name, true);

  // The output support: the same object kind (input / target / generated) with equal contents.
  ASSERT_TRUE(gpu.output);
  EXPECT_EQ(gpu.output == gpu_in, cpu.output == cpu_in);
  EXPECT_EQ(gpu.output == gpu_target, cpu.output == cpu_target);
  expect_same_array(cpu.output->coords(), gpu.output->coords(), c.name + " output coords");
  EXPECT_EQ(gpu.output->stride(), cpu.output->stride());
  EXPECT_EQ(gpu.output->batch_counts(), cpu.output->batch_counts());

  // Cached like on the CPU: the second request returns the same relation and output.
  const auto again = gpu_in->relation(c.kind, c.spec, gpu_target, "test");
  EXPECT_EQ(again.relation, gpu.relation);
  EXPECT_EQ(again.output, gpu.output);
  EXPECT_EQ(gpu_in->cached_relation_count(), cpu_in->cached_relation_count());

  // Deterministic: a fresh set from the same rows builds bitwise the same relation.
  auto gpu_in2 = make_set(rows, kGpu, c.input_stride, counts);
  const auto gpu2 = gpu_in2->relation(c.kind, c.spec, gpu_target, "test");
  expect_same_relation(*cpu.relation, *gpu2.relation, c.name + " (rebuilt)", false, true);
}

// Every relation kind on one cloud (input at stride 1, transposed kinds at stride 2). With
// `empty_targets` the target kinds go onto empty targets.
void check_all_kinds(const std::vector<Row>& rows, std::int32_t batches, const std::string& cloud,
                     bool empty_targets = false) {
  const std::vector<Case> stride1{
      {"submanifold 3", RelationKind::submanifold, spec_of(cube(3))},
      {"submanifold 5", RelationKind::submanifold, spec_of(cube(5))},
      {"submanifold 3x1x5", RelationKind::submanifold, spec_of({3, 1, 5})},
      {"submanifold 3 dilation 2", RelationKind::submanifold, spec_of(cube(3), cube(1), cube(0), cube(2))},
      {"forward k1 s1", RelationKind::forward, spec_of(cube(1))},
      {"forward k3 s1", RelationKind::forward, spec_of(cube(3))},
      {"forward k2 s2", RelationKind::forward, spec_of(cube(2), cube(2))},
      {"forward k3 s2", RelationKind::forward, spec_of(cube(3), cube(2))},
      {"forward k3 s2 p1", RelationKind::forward, spec_of(cube(3), cube(2), cube(1))},
      {"forward k2 s2 dilation 2", RelationKind::forward, spec_of(cube(2), cube(2), cube(0), cube(2))},
      {"forward k4x2x3 s(2,1,3) p(1,0,2)", RelationKind::forward, spec_of({4, 2, 3}, {2, 1, 3}, {1, 0, 2})},
      {"forward expand k3 s2 p1", RelationKind::forward, spec_of(cube(3), cube(2), cube(1), cube(1), true)},
      {"forward expand k2 s1", RelationKind::forward, spec_of(cube(2), cube(1), cube(0), cube(1), true)},
      {"forward expand k3 s1 dilation 2", RelationKind::forward,
       spec_of(cube(3), cube(1), cube(0), cube(2), true)},
  };
  for (const Case& c : stride1) check_case({cloud + ": " + c.name, c.kind, c.spec, c.input_stride}, rows, batches);

  const std::vector<Case> stride2{
      {"transposed k2 s2", RelationKind::transposed, spec_of(cube(2), cube(2)), cube(2)},
      {"transposed k3 s2 p1", RelationKind::transposed, spec_of(cube(3), cube(2), cube(1)), cube(2)},
      {"transposed k3 s1", RelationKind::transposed, spec_of(cube(3)), cube(2)},
      {"generative k2 s2", RelationKind::generative, spec_of(cube(2), cube(2)), cube(2)},
      {"generative k3 s1 dilation 2", RelationKind::generative, spec_of(cube(3), cube(1), cube(0), cube(2)),
       cube(2)},
  };
  for (const Case& c : stride2) check_case({cloud + ": " + c.name, c.kind, c.spec, c.input_stride}, rows, batches);

  // Target kinds: a target from a shifted, partly overlapping cloud (not generated by the rule).
  std::vector<Row> down;
  {
    std::set<Row> seen;
    for (const Row& r : rows) {
      const Row d{r[0], r[1] >> 1, r[2] >> 1, r[3] >> 1};  // floor division by 2
      if (seen.insert(d).second) down.push_back(d);
    }
    std::reverse(down.begin(), down.end());
    down.push_back({0, 1000, -1000, 7});  // a target row without inputs
    if (empty_targets) down.clear();
  }
  check_case({cloud + ": target k3 s2 p1", RelationKind::target, spec_of(cube(3), cube(2), cube(1))}, rows,
             batches, down);
  check_case({cloud + ": target k2 s2", RelationKind::target, spec_of(cube(2), cube(2))}, rows, batches, down);
  std::vector<Row> up;
  for (const Row& r : rows) up.push_back({r[0], 2 * r[1] + 1, 2 * r[2], 2 * r[3] - 1});
  up.push_back({0, 999, 999, 999});
  if (empty_targets) up.clear();
  check_case({cloud + ": transposed_target k3 s2 p1", RelationKind::transposed_target,
              spec_of(cube(3), cube(2), cube(1)), cube(2)},
             rows, batches, up);
  check_case({cloud + ": transposed_target k2 s2", RelationKind::transposed_target, spec_of(cube(2), cube(2)),
              cube(2)},
             rows, batches, up);
}

template <class E>
std::string error_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("unexpected exception: ") + e.what();
  }
  return "no exception";
}

TEST(CudaRelations, AllKindsMatchCpuOnSmallCloudWithNegativeCoords) {
  LATTICE_REQUIRE_CUDA();
  check_all_kinds(random_rows(300, 1, -6, 5, 1), 0, "small");
}

TEST(CudaRelations, AllKindsMatchCpuWithSeveralBatches) {
  LATTICE_REQUIRE_CUDA();
  check_all_kinds(random_rows(2000, 3, -20, 20, 2), 3, "batched");
}

TEST(CudaRelations, AllKindsMatchCpuOnLargerCloud) {
  LATTICE_REQUIRE_CUDA();
  // Dense enough for many edges per row, large enough for many blocks.
  const std::vector<Row> rows = random_rows(40000, 2, -25, 24, 3);
  check_case({"large submanifold 3", RelationKind::submanifold, spec_of(cube(3))}, rows, 2);
  check_case({"large submanifold 5", RelationKind::submanifold, spec_of(cube(5))}, rows, 2);
  check_case({"large forward k2 s2", RelationKind::forward, spec_of(cube(2), cube(2))}, rows, 2);
  check_case({"large forward expand k3 s2 p1", RelationKind::forward,
              spec_of(cube(3), cube(2), cube(1), cube(1), true)},
             rows, 2);
  check_case({"large transposed k2 s2", RelationKind::transposed, spec_of(cube(2), cube(2)), cube(2)}, rows, 2);
  check_case({"large generative k3 s1", RelationKind::generative, spec_of(cube(3)), cube(2)}, rows, 2);
}

TEST(CudaRelations, AllKindsMatchCpuOnOneRow) {
  LATTICE_REQUIRE_CUDA();
  check_all_kinds({{0, -3, 4, -5}}, 1, "one row");
}

TEST(CudaRelations, AllKindsMatchCpuOnEmptySet) {
  LATTICE_REQUIRE_CUDA();
  check_all_kinds({}, 0, "empty");
  check_all_kinds({}, 2, "empty with batch counts");
}

TEST(CudaRelations, ExtremeCoordinatesMatchCpu) {
  LATTICE_REQUIRE_CUDA();
  // Lookups that leave int32 simply find nothing; rows at both ends of the range.
  const std::vector<Row> rows{{0, INT32_MAX, INT32_MAX, INT32_MAX}, {0, INT32_MIN, INT32_MIN, INT32_MIN},
                              {0, INT32_MAX - 1, INT32_MAX, INT32_MAX}, {0, INT32_MIN + 1, INT32_MIN, INT32_MIN},
                              {1, 0, 0, 0}};
  check_case({"extreme submanifold 3", RelationKind::submanifold, spec_of(cube(3))}, rows, 2);
  check_case({"extreme forward k2 s2", RelationKind::forward, spec_of(cube(2), cube(2))}, rows, 2);
  check_case({"extreme forward k3 s2 p1", RelationKind::forward, spec_of(cube(3), cube(2), cube(1))}, rows, 2);
}

TEST(CudaRelations, DuplicateRowsRaiseTheCpuMessage) {
  LATTICE_REQUIRE_CUDA();
  const std::vector<Row> rows{{0, 1, 2, 3}, {0, 4, 5, 6}, {1, 1, 2, 3}, {0, 4, 5, 6}, {0, 1, 2, 3}, {0, 4, 5, 6}};
  const std::string cpu = error_message<ValueError>([&] { make_set(rows, Device::cpu(), cube(1), {}, true); });
  const std::string gpu = error_message<ValueError>([&] { make_set(rows, kGpu, cube(1), {}, true); });
  EXPECT_EQ(cpu, "[SparseTensor] coords: expected unique rows, got row 3 (0, 4, 5, 6) equal to row 1");
  EXPECT_EQ(gpu, cpu);
  // Without validation, the first op that needs the index raises (naming that op).
  auto cpu_set = make_set(rows, Device::cpu());
  auto gpu_set = make_set(rows, kGpu);
  const std::string cpu_rel = error_message<ValueError>(
      [&] { cpu_set->relation(RelationKind::submanifold, spec_of(cube(3)), nullptr, "conv3d"); });
  const std::string gpu_rel = error_message<ValueError>(
      [&] { gpu_set->relation(RelationKind::submanifold, spec_of(cube(3)), nullptr, "conv3d"); });
  EXPECT_EQ(cpu_rel, "[conv3d] coords: expected unique rows, got row 3 (0, 4, 5, 6) equal to row 1");
  EXPECT_EQ(gpu_rel, cpu_rel);
  // A duplicate target is rejected too.
  auto ok_cpu = make_set({{0, 0, 0, 0}}, Device::cpu());
  auto ok_gpu = make_set({{0, 0, 0, 0}}, kGpu);
  auto dup_cpu = make_set(rows, Device::cpu(), cube(2));
  auto dup_gpu = make_set(rows, kGpu, cube(2));
  const KernelSpec down = spec_of(cube(2), cube(2));
  EXPECT_EQ(error_message<ValueError>([&] { ok_gpu->relation(RelationKind::target, down, dup_gpu, "conv3d"); }),
            error_message<ValueError>([&] { ok_cpu->relation(RelationKind::target, down, dup_cpu, "conv3d"); }));
}

TEST(CudaRelations, GeneratedOverflowRaisesTheCpuMessage) {
  LATTICE_REQUIRE_CUDA();
  // transposed: x * 2 + offset leaves int32 at input row 1.
  const std::vector<Row> rows{{0, 5, 5, 5}, {0, 1500000000, 0, 0}, {0, 0, 1500000000, 0}};
  const KernelSpec up = spec_of(cube(2), cube(2));
  auto cpu_in = make_set(rows, Device::cpu(), cube(2));
  auto gpu_in = make_set(rows, kGpu, cube(2));
  const std::string cpu =
      error_message<ValueError>([&] { cpu_in->relation(RelationKind::transposed, up, nullptr, "conv_transpose3d"); });
  const std::string gpu =
      error_message<ValueError>([&] { gpu_in->relation(RelationKind::transposed, up, nullptr, "conv_transpose3d"); });
  EXPECT_NE(cpu.find("output coordinates within the int32 range"), std::string::npos) << cpu;
  EXPECT_NE(cpu.find("at input row 1"), std::string::npos) << cpu;
  EXPECT_EQ(gpu, cpu);

  // expand: (c + p - off) / s leaves int32 at input row 2.
  const std::vector<Row> edge{{0, 0, 0, 0}, {0, -7, 3, 3}, {0, 4, 5, INT32_MAX}};
  const KernelSpec grow = spec_of(cube(3), cube(1), cube(1), cube(1), true);
  auto cpu_e = make_set(edge, Device::cpu());
  auto gpu_e = make_set(edge, kGpu);
  const std::string cpu_x =
      error_message<ValueError>([&] { cpu_e->relation(RelationKind::forward, grow, nullptr, "conv3d"); });
  const std::string gpu_x =
      error_message<ValueError>([&] { gpu_e->relation(RelationKind::forward, grow, nullptr, "conv3d"); });
  EXPECT_NE(cpu_x.find("at input row 2"), std::string::npos) << cpu_x;
  EXPECT_EQ(gpu_x, cpu_x);
}

TEST(CudaRelations, BatchCountErrorsMatchCpu) {
  LATTICE_REQUIRE_CUDA();
  const std::vector<Row> rows{{0, 0, 0, 0}, {1, 0, 0, 0}, {3, 1, 1, 1}, {-1, 2, 2, 2}, {2, 0, 0, 0}};
  auto attempt = [&](Device device, std::vector<std::int64_t> counts) {
    return error_message<ValueError>([&] { make_set(rows, device, cube(1), counts); });
  };
  const std::string bad_id = attempt(Device::cpu(), {1, 1, 1, 2});
  EXPECT_NE(bad_id.find("batch id -1 at row 3"), std::string::npos) << bad_id;
  EXPECT_EQ(attempt(kGpu, {1, 1, 1, 2}), bad_id);
  const std::vector<Row> good{{0, 0, 0, 0}, {1, 0, 0, 0}, {1, 1, 1, 1}};
  auto attempt_good = [&](Device device, std::vector<std::int64_t> counts) {
    return error_message<ValueError>([&] { make_set(good, device, cube(1), counts); });
  };
  EXPECT_EQ(attempt_good(kGpu, {2, 1}), attempt_good(Device::cpu(), {2, 1}));
  EXPECT_EQ(attempt_good(kGpu, {1, 1, 1}), attempt_good(Device::cpu(), {1, 1, 1}));
  EXPECT_NO_THROW(make_set(good, kGpu, cube(1), std::vector<std::int64_t>{1, 2}));
}

TEST(CudaRelations, DeviceIndexRefusesHostLookups) {
  LATTICE_REQUIRE_CUDA();
  auto set = make_set({{0, 1, 2, 3}}, kGpu, cube(1), {}, true);
  EXPECT_THROW(set->lookup(0, 1, 2, 3), UnsupportedError);
}

TEST(CudaRelations, TargetOnAnotherDeviceIsRejected) {
  LATTICE_REQUIRE_CUDA();
  auto cpu_set = make_set({{0, 0, 0, 0}}, Device::cpu());
  auto gpu_set = make_set({{0, 0, 0, 0}}, kGpu, cube(2));
  EXPECT_EQ(error_message<ValueError>([&] {
              cpu_set->relation(RelationKind::target, spec_of(cube(2), cube(2)), gpu_set, "conv3d");
            }),
            "[conv3d] coordinates: expected the device of the input (cpu), got cuda:0");
}


// ---- empty sets, as the Python front end hands them over ----------------------------------------

// No device needed: a zero-element array is contiguous whatever its strides (a CUDA one must never
// need a clone), and a DLPack import of one gets canonical strides.
TEST(CudaRelations, ZeroRowArraysWithForeignStridesAreContiguous) {
  for (const Device device : {Device::cpu(), kGpu}) {
    for (const Shape& strides : {Shape{1, 0}, Shape{0, 0}, Shape{1, 1}, Shape{4, 1}}) {
      const Array a = Array::wrap(nullptr, {0, 4}, strides, Dtype::i32, device, nullptr);
      EXPECT_TRUE(a.is_contiguous()) << to_string(device);
      EXPECT_NO_THROW(a.contiguous()) << to_string(device);  // a CUDA clone would throw without a device
    }
    // Zero rows after a non-canonical stride of a later axis, and an empty trailing axis.
    EXPECT_TRUE(Array::wrap(nullptr, {0, 4, 3}, {0, 0, 7}, Dtype::f32, device, nullptr).is_contiguous());
    EXPECT_TRUE(Array::wrap(nullptr, {5, 0}, {3, 9}, Dtype::f32, device, nullptr).is_contiguous());
    // Non-empty strided arrays stay non-contiguous.
    int fake[8] = {};
    EXPECT_FALSE(Array::wrap(fake, {2, 2}, {1, 2}, Dtype::i32, device, nullptr).is_contiguous());

    std::int64_t shape[2] = {0, 4};
    std::int64_t strides[2] = {1, 0};
    auto* managed = new LatticeDLManagedTensor{};
    managed->dl_tensor.data = nullptr;
    managed->dl_tensor.device = {device.is_cpu() ? kLatticeDLCPU : kLatticeDLCUDA, 0};
    managed->dl_tensor.ndim = 2;
    managed->dl_tensor.dtype = {kLatticeDLInt, 32, 1};
    managed->dl_tensor.shape = shape;
    managed->dl_tensor.strides = strides;
    managed->deleter = [](LatticeDLManagedTensor* self) { delete self; };
    const Array imported = Array::from_dlpack(managed);
    EXPECT_EQ(imported.shape(), (Shape{0, 4}));
    EXPECT_EQ(imported.strides(), (Shape{4, 1}));
    EXPECT_TRUE(imported.is_contiguous());
  }
}

TEST(CudaRelations, AllKindsMatchCpuOnEmptySetsWithTorchStrides) {
  LATTICE_REQUIRE_CUDA();
  for (const Shape& strides : {Shape{1, 0}, Shape{0, 0}}) {
    ZeroRowStrides scope(strides);
    check_all_kinds({}, 0, "empty, strides " + format_shape(strides));
    check_all_kinds({}, 2, "empty with batch counts, strides " + format_shape(strides));
    check_all_kinds({}, 0, "empty onto empty targets, strides " + format_shape(strides), true);
  }
}

TEST(CudaRelations, TargetKindsMatchCpuOnEmptyTargets) {
  LATTICE_REQUIRE_CUDA();
  check_all_kinds({}, 0, "empty onto empty targets", true);
  check_all_kinds(random_rows(300, 2, -6, 5, 4), 2, "cloud onto empty targets", true);
  check_all_kinds({{0, -3, 4, -5}}, 1, "one row onto empty targets", true);
}

// ---- conv and pool on empty inputs and targets ------------------------------------------------

Array filled(Shape shape, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  Array a = Array::empty(std::move(shape), Dtype::f32);
  for (std::int64_t e = 0; e < a.numel(); ++e) a.data<float>()[e] = u(gen);
  return a;
}

// `gpu` is on cuda:0 with the shape of `cpu` (f32) and values within 1e-5 relative to |cpu|.
void expect_same_f32(const Array& cpu, const Array& gpu, const std::string& what) {
  ASSERT_TRUE(cpu.defined()) << what;
  ASSERT_TRUE(gpu.defined()) << what;
  EXPECT_EQ(gpu.device(), kGpu) << what;
  ASSERT_EQ(gpu.dtype(), cpu.dtype()) << what;
  ASSERT_EQ(gpu.shape(), cpu.shape()) << what;
  const Array a = gpu.to(Device::cpu()), b = cpu.contiguous();
  for (std::int64_t e = 0; e < b.numel(); ++e) {
    const float x = a.data<float>()[e], y = b.data<float>()[e];
    ASSERT_LE(std::abs(x - y), 1e-5f * (1.0f + std::abs(y))) << what << ": element " << e;
  }
}

struct ConvEdge {
  std::string name;
  RelationKind kind;
  Int3 kernel, stride;
  Int3 input_stride;
  std::vector<Row> input;
  std::optional<std::vector<Row>> target;  // target kinds
};

// Conv forward and every gradient on cuda:0 (default route and each CUDA route it admits) equal
// the CPU reference, for empty inputs and/or empty targets.
TEST(CudaRelations, ConvOnEmptyInputsAndTargetsMatchesCpu) {
  LATTICE_REQUIRE_CUDA();
  const std::vector<Row> cloud = random_rows(200, 2, -5, 5, 7);
  const std::vector<ConvEdge> cases{
      {"submanifold k3 empty", RelationKind::submanifold, cube(3), cube(1), cube(1), {}, {}},
      {"forward k2 s2 empty", RelationKind::forward, cube(2), cube(2), cube(1), {}, {}},
      {"forward k3 s2 expand empty", RelationKind::forward, cube(3), cube(2), cube(1), {}, {}},
      {"target k2 s2 empty onto empty", RelationKind::target, cube(2), cube(2), cube(1), {}, std::vector<Row>{}},
      {"target k2 s2 empty onto rows", RelationKind::target, cube(2), cube(2), cube(1), {},
       std::vector<Row>{{0, 1, 2, 3}, {1, -4, 0, 0}}},
      {"target k2 s2 cloud onto empty", RelationKind::target, cube(2), cube(2), cube(1), cloud, std::vector<Row>{}},
      {"transposed k2 s2 empty", RelationKind::transposed, cube(2), cube(2), cube(2), {}, {}},
      {"transposed_target k2 s2 empty onto empty", RelationKind::transposed_target, cube(2), cube(2), cube(2), {},
       std::vector<Row>{}},
      {"transposed_target k2 s2 cloud onto empty", RelationKind::transposed_target, cube(2), cube(2), cube(2),
       cloud, std::vector<Row>{}},
      {"generative k2 s2 empty", RelationKind::generative, cube(2), cube(2), cube(2), {}, {}},
  };
  const std::int64_t c_in = 8, c_out = 8;
  for (const Shape& strides : {Shape{4, 1}, Shape{1, 0}}) {
    ZeroRowStrides scope(strides);
    for (const ConvEdge& c : cases) {
      SCOPED_TRACE(c.name + ", zero-row strides " + format_shape(strides));
      auto cpu_in = make_set(c.input, Device::cpu(), c.input_stride);
      auto gpu_in = make_set(c.input, kGpu, c.input_stride);
      std::shared_ptr<CoordinateSet> cpu_t, gpu_t;
      if (c.target) {
        Int3 ts{};
        for (int a = 0; a < 3; ++a)
          ts[a] = c.kind == RelationKind::target ? c.input_stride[a] * c.stride[a] : c.input_stride[a] / c.stride[a];
        cpu_t = make_set(*c.target, Device::cpu(), ts);
        gpu_t = make_set(*c.target, kGpu, ts);
      }
      ops::ConvOptions o;
      o.kernel_size = c.kernel;
      o.stride = c.stride;
      o.expand = c.name.find("expand") != std::string::npos;
      ops::ConvOptions ref_o = o;
      ref_o.policy.force = RouteId::conv_reference;
      const std::string op = c.kind == RelationKind::submanifold ? "subm_conv3d"
                             : c.kind == RelationKind::generative ? "generative_conv_transpose3d"
                             : (c.kind == RelationKind::forward || c.kind == RelationKind::target) ? "conv3d"
                                                                                                 : "conv_transpose3d";
      const ops::ConvPlan pc = ops::plan_conv(op, c.kind, cpu_in, ref_o, cpu_t);
      const std::int64_t kv = pc.relation->kernel_volume;
      const Array x = filled({pc.relation->n_in, c_in}, 1), w = filled({kv, c_in, c_out}, 2);
      const Array bias = filled({c_out}, 3), dy = filled({pc.relation->n_out, c_out}, 4);
      const Array y_ref = ops::conv_forward(pc, x, w, &bias);
      const ops::ConvGrads g_ref = ops::conv_backward(pc, x, w, dy, {true, true, true});
      for (const std::optional<RouteId> route : {std::optional<RouteId>{}, std::optional<RouteId>{RouteId::conv_cuda_gather_gemm_scatter},
                                                 std::optional<RouteId>{RouteId::conv_implicit_gemm_sm80}}) {
        const std::string rname = route ? std::string(to_string(*route)) : "default";
        SCOPED_TRACE(rname);
        ops::ConvOptions go = o;
        go.policy.force = route;
        const ops::ConvPlan pg = ops::plan_conv(op, c.kind, gpu_in, go, gpu_t);
        expect_same_relation(*pc.relation, *pg.relation, c.name + " relation");
        expect_same_array(pc.output->coords(), pg.output->coords(), c.name + " output coords");
        EXPECT_EQ(pg.output->stride(), pc.output->stride());
        const Array xd = x.to(kGpu), wd = w.to(kGpu), bd = bias.to(kGpu), dyd = dy.to(kGpu);
        if (route && ops::explain_conv(pg, xd, wd).chosen != route) {
          std::printf("[  NOTE    ] %s: %s not admitted for the forward pass\n", c.name.c_str(), rname.c_str());
          continue;
        }
        expect_same_f32(y_ref, ops::conv_forward(pg, xd, wd, &bd), c.name + " forward");
        const bool grads_admitted = !route || (ops::explain_conv(pg, xd, wd, ConvPass::input_grad).chosen == route &&
                                               ops::explain_conv(pg, xd, wd, ConvPass::weight_grad).chosen == route);
        if (!grads_admitted) continue;
        const ops::ConvGrads g = ops::conv_backward(pg, xd, wd, dyd, {true, true, true});
        expect_same_f32(g_ref.input, g.input, c.name + " input grad");
        expect_same_f32(g_ref.weight, g.weight, c.name + " weight grad");
        expect_same_f32(g_ref.bias, g.bias, c.name + " bias grad");
      }
    }
  }
}

// Pooling forward and input gradient on cuda:0 equal the CPU reference for empty inputs and/or
// empty targets (local, global, transposed and trilinear).
TEST(CudaRelations, PoolOnEmptyInputsAndTargetsMatchesCpu) {
  LATTICE_REQUIRE_CUDA();
  const std::vector<Row> cloud = random_rows(200, 2, -5, 5, 8);
  using MakePlan = std::function<ops::PoolPlan(const std::shared_ptr<CoordinateSet>&,
                                               const std::shared_ptr<CoordinateSet>&, const RoutePolicy&)>;
  struct PoolEdge {
    std::string name;
    Int3 input_stride;
    std::vector<Row> input;
    std::optional<std::vector<Row>> target;
    Int3 target_stride;
    MakePlan make;
  };
  auto options = [](Int3 k, Int3 s, Int3 p, const RoutePolicy& policy) {
    ops::PoolOptions o;
    o.kernel_size = k;
    o.stride = s;
    o.padding = p;
    o.policy = policy;
    return o;
  };
  auto local = [&](PoolMode mode, Int3 k, Int3 s, Int3 p) {
    return [=](const std::shared_ptr<CoordinateSet>& x, const std::shared_ptr<CoordinateSet>& t,
               const RoutePolicy& policy) { return ops::plan_pool("pool3d", mode, x, options(k, s, p, policy), t); };
  };
  auto global = [&](PoolMode mode) {
    return [=](const std::shared_ptr<CoordinateSet>& x, const std::shared_ptr<CoordinateSet>&,
               const RoutePolicy& policy) {
      return ops::plan_global_pool("global_pool", mode, x, options(cube(2), cube(2), cube(0), policy));
    };
  };
  const MakePlan transposed = [&](const std::shared_ptr<CoordinateSet>& x, const std::shared_ptr<CoordinateSet>& t,
                                  const RoutePolicy& policy) {
    return ops::plan_pool_transpose("pool_transpose3d", x, options(cube(2), cube(2), cube(0), policy), t);
  };
  const MakePlan trilinear = [&](const std::shared_ptr<CoordinateSet>& x, const std::shared_ptr<CoordinateSet>& t,
                                 const RoutePolicy& policy) {
    ops::PoolOptions o;
    o.policy = policy;
    return ops::plan_trilinear_upsample("trilinear_upsample3d", x, t ? std::nullopt : std::optional<Int3>(cube(2)),
                                        t, o);
  };
  const std::vector<PoolEdge> cases{
      {"max k2 s2 empty", cube(1), {}, {}, cube(2), local(PoolMode::max, cube(2), cube(2), cube(0))},
      {"avg k3 s2 p1 empty", cube(1), {}, {}, cube(2), local(PoolMode::avg, cube(3), cube(2), cube(1))},
      {"sum k2 s2 empty onto empty", cube(1), {}, std::vector<Row>{}, cube(2),
       local(PoolMode::sum, cube(2), cube(2), cube(0))},
      {"max k2 s2 empty onto rows", cube(1), {}, std::vector<Row>{{0, 0, 0, 0}, {1, 3, -2, 1}}, cube(2),
       local(PoolMode::max, cube(2), cube(2), cube(0))},
      {"max k2 s2 cloud onto empty", cube(1), cloud, std::vector<Row>{}, cube(2),
       local(PoolMode::max, cube(2), cube(2), cube(0))},
      {"global sum empty", cube(1), {}, {}, cube(1), global(PoolMode::sum)},
      {"global avg empty", cube(1), {}, {}, cube(1), global(PoolMode::avg)},
      {"global max empty", cube(1), {}, {}, cube(1), global(PoolMode::max)},
      {"transposed k2 s2 empty", cube(2), {}, {}, cube(1), transposed},
      {"transposed k2 s2 empty onto empty", cube(2), {}, std::vector<Row>{}, cube(1), transposed},
      {"transposed k2 s2 cloud onto empty", cube(2), cloud, std::vector<Row>{}, cube(1), transposed},
      {"trilinear empty", cube(2), {}, {}, cube(1), trilinear},
      {"trilinear empty onto empty", cube(2), {}, std::vector<Row>{}, cube(1), trilinear},
      {"trilinear cloud onto empty", cube(2), cloud, std::vector<Row>{}, cube(1), trilinear},
  };
  const std::int64_t channels = 6;
  for (const Shape& strides : {Shape{4, 1}, Shape{1, 0}}) {
    ZeroRowStrides scope(strides);
    for (const PoolEdge& c : cases) {
      SCOPED_TRACE(c.name + ", zero-row strides " + format_shape(strides));
      auto cpu_in = make_set(c.input, Device::cpu(), c.input_stride);
      auto gpu_in = make_set(c.input, kGpu, c.input_stride);
      std::shared_ptr<CoordinateSet> cpu_t, gpu_t;
      if (c.target) {
        cpu_t = make_set(*c.target, Device::cpu(), c.target_stride);
        gpu_t = make_set(*c.target, kGpu, c.target_stride);
      }
      // CPU first: where the CPU raises (global max of an empty input), cuda:0 must raise the same.
      std::optional<ops::PoolPlan> pc;
      std::string cpu_error;
      try {
        pc = c.make(cpu_in, cpu_t, RoutePolicy{RouteId::pool_reference});
      } catch (const ValueError& e) {
        cpu_error = e.what();
      }
      if (!pc) {
        EXPECT_EQ(error_message<ValueError>([&] { c.make(gpu_in, gpu_t, RoutePolicy{}); }), cpu_error);
        continue;
      }
      const ops::PoolPlan pg = c.make(gpu_in, gpu_t, RoutePolicy{});
      EXPECT_EQ(pg.n_in, pc->n_in);
      EXPECT_EQ(pg.n_out, pc->n_out);
      EXPECT_EQ(pg.n_edges, pc->n_edges);
      ASSERT_EQ(static_cast<bool>(pg.output), static_cast<bool>(pc->output));
      if (pc->output) {
        expect_same_array(pc->output->coords(), pg.output->coords(), c.name + " output coords");
        EXPECT_EQ(pg.output->stride(), pc->output->stride());
      }
      const Array x = filled({pc->n_in, channels}, 5);
      const ops::PoolOutput yc = ops::pool_forward(*pc, x);
      const Array dy = filled({yc.out.dim(0), channels}, 6);
      const Array dxc = ops::pool_backward(*pc, dy, yc.argmax.defined() ? &yc.argmax : nullptr);
      const ops::PoolOutput yg = ops::pool_forward(pg, x.to(kGpu));
      expect_same_f32(yc.out, yg.out, c.name + " forward");
      ASSERT_EQ(yg.argmax.defined(), yc.argmax.defined());
      if (yc.argmax.defined()) expect_same_array(yc.argmax, yg.argmax, c.name + " argmax");
      const Array dxg = ops::pool_backward(pg, dy.to(kGpu), yg.argmax.defined() ? &yg.argmax : nullptr);
      expect_same_f32(dxc, dxg, c.name + " input grad");
    }
  }
}


// Strided device arrays are gathered on the device (the allocator's strided_copy): every element
// size, a permutation with a non-unit last stride, and a sub-grid; the CPU gather is the oracle.
// No host synchronisation beyond the final read-back.
TEST(CudaArrays, StridedCloneGathersOnTheDeviceLikeTheCpu) {
  LATTICE_REQUIRE_CUDA();
  for (Dtype dt : {Dtype::u8, Dtype::f16, Dtype::f32, Dtype::i64}) {
    const std::int64_t es = static_cast<std::int64_t>(size_of(dt));
    Array host = Array::empty({2, 3, 5, 7}, dt);
    auto* bytes = static_cast<std::uint8_t*>(host.raw_data());
    for (std::int64_t b = 0; b < host.numel() * es; ++b) bytes[b] = static_cast<std::uint8_t>((b * 37 + 11) & 0xff);
    const Array dev = host.to(kGpu);
    const std::vector<std::pair<Shape, Shape>> views = {
        {{7, 5, 3, 2}, {1, 7, 35, 105}},  // all axes reversed
        {{3, 7, 2}, {35, 1, 105}},       // a permutation of a sub-block (the weight layouts' kind)
        {{2, 2, 3, 4}, {105, 70, 14, 2}},  // every other row / column
    };
    for (const auto& [shape, strides] : views) {
      const Array want = host.strided_view(shape, strides).contiguous();
      const std::int64_t before = device_memory_stats(DeviceType::cuda).host_syncs;
      const Array got_dev = dev.strided_view(shape, strides).contiguous();
      EXPECT_EQ(device_memory_stats(DeviceType::cuda).host_syncs, before) << "gathered through the host";
      EXPECT_TRUE(got_dev.is_contiguous());
      EXPECT_EQ(got_dev.device(), kGpu);
      const Array got = got_dev.to(Device::cpu());
      ASSERT_EQ(got.shape(), want.shape());
      EXPECT_EQ(std::memcmp(got.raw_data(), want.raw_data(), want.nbytes()), 0) << to_string(dt);
    }
  }
}

}  // namespace
}  // namespace lattice
