// lattice::Runtime (include/lattice/runtime.h), independent of Python: a graph.json +
// weights.safetensors written here by hand is run by the Runtime and compared, bit for bit, with
// the same chain of lattice::ops calls and plain loops; malformed directories must fail with the
// "[Runtime] ..." ValueError naming what is wrong. (The Python exporter <-> C++ parity is checked
// by tests/python/test_export.py through lattice-run.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <unistd.h>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "lattice/lattice.h"
#include "lattice/runtime.h"

namespace {

using lattice::Array;
using lattice::Dtype;
using lattice::SparseTensor;
namespace fs = std::filesystem;

struct Tensor {
  std::vector<std::int64_t> shape;
  std::vector<float> data;
};

void write_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors) {
  std::string header = "{";
  std::uint64_t off = 0;
  for (const auto& [name, t] : tensors) {
    if (header.size() > 1) header += ",";
    header += "\"" + name + "\":{\"dtype\":\"F32\",\"shape\":[";
    for (std::size_t i = 0; i < t.shape.size(); ++i) header += (i ? "," : "") + std::to_string(t.shape[i]);
    const std::uint64_t n = t.data.size() * 4;
    header += "],\"data_offsets\":[" + std::to_string(off) + "," + std::to_string(off + n) + "]}";
    off += n;
  }
  header += "}";
  std::ofstream f(path, std::ios::binary);
  const std::uint64_t len = header.size();
  f.write(reinterpret_cast<const char*>(&len), 8);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  for (const auto& [name, t] : tensors)
    f.write(reinterpret_cast<const char*>(t.data.data()), static_cast<std::streamsize>(t.data.size() * 4));
}

Tensor random_tensor(std::vector<std::int64_t> shape, std::mt19937& rng, float lo = -0.5f, float hi = 0.5f) {
  std::int64_t n = 1;
  for (auto s : shape) n *= s;
  std::uniform_real_distribution<float> u(lo, hi);
  Tensor t{shape, std::vector<float>(static_cast<std::size_t>(n))};
  for (auto& v : t.data) v = u(rng);
  return t;
}

Array to_array(const Tensor& t) { return Array::from_vector(t.data, t.shape); }

// The graph under test: subm conv (+bias) -> scale_shift -> relu -> strided conv -> transposed
// conv onto the relu's rows -> residual add -> cat with the input -> linear (+bias); outputs the
// logits and the strided level.
const char* kGraph = R"({
 "format": "lattice.graph", "version": 1, "dtype": "float32",
 "inputs": [{"name": "input", "value": "v0", "channels": 3, "stride": [1, 1, 1]}],
 "outputs": [{"name": "output0", "value": "v8"}, {"name": "output1", "value": "v4"}],
 "coords": {"c0": {"stride": [1, 1, 1]}, "c1": {"stride": [2, 2, 2]}},
 "values": {"v0": {"coords": "c0", "channels": 3}, "v1": {"coords": "c0", "channels": 8},
            "v2": {"coords": "c0", "channels": 8}, "v3": {"coords": "c0", "channels": 8},
            "v4": {"coords": "c1", "channels": 6}, "v5": {"coords": "c0", "channels": 8},
            "v6": {"coords": "c0", "channels": 8}, "v7": {"coords": "c0", "channels": 11},
            "v8": {"coords": "c0", "channels": 4}},
 "nodes": [
  {"name": "stem", "op": "subm_conv3d", "inputs": ["v0"], "output": "v1",
   "attrs": {"kernel_size": [3, 3, 3], "dilation": [1, 1, 1]}, "weights": {"weight": "n0.weight", "bias": "n0.bias"}},
  {"name": "bn", "op": "scale_shift", "inputs": ["v1"], "output": "v2", "attrs": {},
   "weights": {"scale": "n1.scale", "shift": "n1.shift"}},
  {"name": "act", "op": "relu", "inputs": ["v2"], "output": "v3", "attrs": {}, "weights": {}},
  {"name": "down", "op": "conv3d", "inputs": ["v3"], "output": "v4",
   "attrs": {"kernel_size": [2, 2, 2], "stride": [2, 2, 2], "padding": [0, 0, 0], "dilation": [1, 1, 1], "expand": false},
   "weights": {"weight": "n3.weight"}},
  {"name": "up", "op": "conv_transpose3d", "inputs": ["v4", "v3"], "output": "v5",
   "attrs": {"kernel_size": [2, 2, 2], "stride": [2, 2, 2], "padding": [0, 0, 0], "dilation": [1, 1, 1]},
   "weights": {"weight": "n4.weight"}},
  {"name": "res", "op": "add", "inputs": ["v5", "v3"], "output": "v6", "attrs": {}, "weights": {}},
  {"name": "skip", "op": "cat", "inputs": ["v6", "v0"], "output": "v7", "attrs": {}, "weights": {}},
  {"name": "head", "op": "linear", "inputs": ["v7"], "output": "v8", "attrs": {},
   "weights": {"weight": "n7.weight", "bias": "n7.bias"}}
 ],
 "metadata": {"voxelize": {"voxel_size": 0.5, "reduction": "mean",
   "features": [{"source": "offset_x"}, {"source": "z", "add": 1.5, "divide": 4.0}, {"source": "intensity"}]}}
})";

class RuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("lattice_runtime_test_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    std::mt19937 rng(7);
    w_["n0.weight"] = random_tensor({8, 3, 3, 3, 3}, rng);
    w_["n0.bias"] = random_tensor({8}, rng);
    w_["n1.scale"] = random_tensor({8}, rng, 0.5f, 1.5f);
    w_["n1.shift"] = random_tensor({8}, rng);
    w_["n3.weight"] = random_tensor({6, 2, 2, 2, 8}, rng);
    w_["n4.weight"] = random_tensor({8, 2, 2, 2, 6}, rng);
    w_["n7.weight"] = random_tensor({4, 11}, rng);
    w_["n7.bias"] = random_tensor({4}, rng);
    write(kGraph, w_);
    // coordinates: distinct random voxels in a 12^3 box, batch 0
    std::set<std::array<int, 3>> seen;
    std::uniform_int_distribution<int> c(0, 11);
    while (seen.size() < 300) seen.insert({c(rng), c(rng), c(rng)});
    std::vector<std::int32_t> co;
    for (const auto& s : seen) co.insert(co.end(), {0, s[0], s[1], s[2]});
    coords_ = Array::from_vector(co, {static_cast<std::int64_t>(seen.size()), 4});
    feats_ = to_array(random_tensor({static_cast<std::int64_t>(seen.size()), 3}, rng, -1.0f, 1.0f));
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write(const std::string& graph, const std::map<std::string, Tensor>& w) {
    std::ofstream(dir_ / "graph.json") << graph;
    write_safetensors((dir_ / "weights.safetensors").string(), w);
  }
  std::string dir() const { return dir_.string(); }

  fs::path dir_;
  std::map<std::string, Tensor> w_;
  Array coords_, feats_;
};

bool same_bits(const Array& a, const Array& b) {
  Array x = a.contiguous(), y = b.contiguous();
  return x.shape() == y.shape() && x.dtype() == y.dtype() && std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0;
}

// The Runtime equals the hand-chained ops bit for bit (same routes, same order), and the
// outputs sit on the coordinates the graph says (the logits on the input's rows).
TEST_F(RuntimeTest, RunsTheGraphLikeTheOpsChain) {
  lattice::Runtime net = lattice::Runtime::load(dir());
  EXPECT_EQ(net.num_nodes(), 8u);
  EXPECT_EQ(net.input_channels(), 3);
  EXPECT_EQ(net.output_names(), (std::vector<std::string>{"output0", "output1"}));
  SparseTensor x(coords_, feats_);
  std::vector<SparseTensor> out = net.run(x);
  ASSERT_EQ(out.size(), 2u);

  namespace ops = lattice::ops;
  ops::ConvOptions k3;
  Array b0 = to_array(w_["n0.bias"]);
  SparseTensor y1 = ops::subm_conv3d(x, to_array(w_["n0.weight"]), k3, &b0);
  const std::int64_t n = x.size();
  Array f3 = Array::empty({n, 8}, Dtype::f32);
  for (std::int64_t r = 0; r < n; ++r)
    for (int c = 0; c < 8; ++c) {
      float v = y1.feats().data<float>()[r * 8 + c] * w_["n1.scale"].data[c] + w_["n1.shift"].data[c];
      f3.data<float>()[r * 8 + c] = v < 0 ? 0.0f : v;
    }
  SparseTensor y3 = y1.with_feats(f3);
  ops::ConvOptions down;
  down.kernel_size = {2, 2, 2};
  down.stride = {2, 2, 2};
  SparseTensor y4 = ops::conv3d(y3, to_array(w_["n3.weight"]), down);
  SparseTensor y5 = ops::conv_transpose3d(y4, to_array(w_["n4.weight"]), down, nullptr, &y3);
  ASSERT_EQ(y5.key(), y3.key());
  Array f7 = Array::empty({n, 11}, Dtype::f32);
  for (std::int64_t r = 0; r < n; ++r) {
    for (int c = 0; c < 8; ++c)
      f7.data<float>()[r * 11 + c] = y5.feats().data<float>()[r * 8 + c] + f3.data<float>()[r * 8 + c];
    for (int c = 0; c < 3; ++c) f7.data<float>()[r * 11 + 8 + c] = feats_.data<float>()[r * 3 + c];
  }
  Array b7 = to_array(w_["n7.bias"]);
  ops::ConvOptions k1;
  k1.kernel_size = {1, 1, 1};
  SparseTensor y8 = ops::subm_conv3d(y3.with_feats(f7), to_array(w_["n7.weight"]).reshape({4, 1, 1, 1, 11}), k1, &b7);

  EXPECT_EQ(out[0].key(), x.key());  // the logits are on the input's rows
  EXPECT_TRUE(same_bits(out[0].feats(), y8.feats()));
  EXPECT_TRUE(same_bits(out[1].coords(), y4.coords()));
  EXPECT_TRUE(same_bits(out[1].feats(), y4.feats()));
  // not vacuous: the logits are not all equal / zero
  float lo = 1e30f, hi = -1e30f;
  for (std::int64_t i = 0; i < out[0].feats().numel(); ++i) {
    lo = std::min(lo, out[0].feats().data<float>()[i]);
    hi = std::max(hi, out[0].feats().data<float>()[i]);
  }
  EXPECT_GT(hi - lo, 0.1f);

  std::vector<lattice::NodeTiming> t;
  std::vector<SparseTensor> again = net.run(coords_, feats_, &t);
  ASSERT_EQ(t.size(), 8u);
  EXPECT_EQ(t[3].name, "down");
  EXPECT_EQ(t[3].op, "conv3d");
  EXPECT_TRUE(same_bits(again[0].feats(), out[0].feats()));  // deterministic
}

// metadata["voxelize"]: per-point features (offset in the voxel in double, (z + add) / divide in
// float) averaged per voxel; inverse maps every point to its voxel.
TEST_F(RuntimeTest, VoxelizesAsTheMetadataSays) {
  lattice::Runtime net = lattice::Runtime::load(dir());
  ASSERT_TRUE(net.voxelize_spec().present);
  std::vector<float> pts = {0.1f, 0.2f, 0.3f, 5.0f,  0.4f, 0.1f, 0.2f, 7.0f,  1.2f, -0.3f, 2.0f, 1.0f};
  lattice::VoxelizedScan v = net.voxelize(Array::from_vector(pts, {3, 4}));
  ASSERT_EQ(v.tensor.size(), 2);  // points 0 and 1 share voxel (0, 0, 0)
  const std::int64_t* inv = v.inverse.data<std::int64_t>();
  EXPECT_EQ(inv[0], inv[1]);
  EXPECT_NE(inv[0], inv[2]);
  const float* f = v.tensor.feats().data<float>();
  const std::int64_t r0 = inv[0], r2 = inv[2];
  auto off = [](float p) {
    double s = static_cast<double>(p) / 0.5;
    return static_cast<float>(s - std::floor(s) - 0.5);
  };
  EXPECT_FLOAT_EQ(f[r0 * 3 + 0], (off(0.1f) + off(0.4f)) / 2);
  EXPECT_FLOAT_EQ(f[r0 * 3 + 1], ((0.3f + 1.5f) / 4.0f + (0.2f + 1.5f) / 4.0f) / 2);
  EXPECT_FLOAT_EQ(f[r0 * 3 + 2], 6.0f);
  EXPECT_FLOAT_EQ(f[r2 * 3 + 1], (2.0f + 1.5f) / 4.0f);
  const std::int32_t* c = v.tensor.coords().data<std::int32_t>();
  EXPECT_EQ(c[r2 * 4 + 1], 2);   // floor(1.2 / 0.5)
  EXPECT_EQ(c[r2 * 4 + 2], -1);  // floor(-0.3 / 0.5)
  EXPECT_EQ(c[r2 * 4 + 3], 4);
}

void expect_value_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected a ValueError containing " << needle;
  } catch (const lattice::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("[Runtime]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

std::string replaced(std::string s, const std::string& from, const std::string& to) {
  auto p = s.find(from);
  EXPECT_NE(p, std::string::npos) << from;
  return s.replace(p, from.size(), to);
}

TEST_F(RuntimeTest, RejectsMalformedDirectories) {
  write(replaced(kGraph, "\"op\": \"relu\"", "\"op\": \"swish3d\""), w_);
  expect_value_error([&] { lattice::Runtime::load(dir()); }, "swish3d");
  write(replaced(kGraph, "\"version\": 1", "\"version\": 7"), w_);
  expect_value_error([&] { lattice::Runtime::load(dir()); }, "version");
  auto bad = w_;
  bad["n3.weight"] = Tensor{{6, 3, 3, 3, 8}, std::vector<float>(6 * 27 * 8, 0.0f)};
  write(kGraph, bad);
  expect_value_error([&] { lattice::Runtime::load(dir()); }, "node down weight: expected shape (6, 2, 2, 2, 8)");
  bad = w_;
  bad.erase("n7.bias");
  write(kGraph, bad);
  expect_value_error([&] { lattice::Runtime::load(dir()); }, "n7.bias");
  write(kGraph, w_);
  fs::resize_file(dir_ / "weights.safetensors", fs::file_size(dir_ / "weights.safetensors") - 4);
  expect_value_error([&] { lattice::Runtime::load(dir()); }, "data_offsets");
  write(kGraph, w_);
  lattice::Runtime net = lattice::Runtime::load(dir());
  expect_value_error([&] { net.run(coords_, Array::zeros({coords_.dim(0), 5}, Dtype::f32)); }, "input feats");
}

// Graph version 3: a window_conv3d node (lattice.models.WindowConv3d) runs as the documented
// chain: coordinates moved by attrs.shift, conv3d with padding 0 and expand, then only the rows
// inside [0, crop) kept in order; bit for bit that chain of lattice::ops calls. Without crop the
// conv3d output is returned as is; a version-2 graph may not hold the op.
const char* kWindowGraph = R"({
 "format": "lattice.graph", "version": 3, "dtype": "float32",
 "inputs": [{"name": "input", "value": "v0", "channels": 3, "stride": [1, 1, 1]}],
 "outputs": [{"name": "output0", "value": "v1"}],
 "coords": {"c0": {"stride": [1, 1, 1]}, "c1": {"stride": [2, 2, 2]}},
 "values": {"v0": {"coords": "c0", "channels": 3}, "v1": {"coords": "c1", "channels": 5}},
 "nodes": [
  {"name": "down", "op": "window_conv3d", "inputs": ["v0"], "output": "v1",
   "attrs": {"kernel_size": [3, 3, 3], "stride": [2, 2, 2], "dilation": [1, 1, 1], "shift": [1, -1, 0],
             "crop": [4, 5, 3]},
   "weights": {"weight": "n0.weight", "bias": "n0.bias"}}
 ]
})";

TEST_F(RuntimeTest, RunsWindowConvolutionsAsShiftConvCrop) {
  std::mt19937 rng(11);
  std::map<std::string, Tensor> w;
  w["n0.weight"] = random_tensor({5, 3, 3, 3, 3}, rng);
  w["n0.bias"] = random_tensor({5}, rng);
  write(kWindowGraph, w);
  lattice::Runtime net = lattice::Runtime::load(dir());
  EXPECT_EQ(net.version(), 3);
  SparseTensor x(coords_, feats_);
  std::vector<SparseTensor> out = net.run(x);
  ASSERT_EQ(out.size(), 1u);

  namespace ops = lattice::ops;
  const std::int64_t n = x.size();
  Array moved = coords_.clone();
  const int shift[3] = {1, -1, 0};
  for (std::int64_t r = 0; r < n; ++r)
    for (int a = 0; a < 3; ++a) moved.data<std::int32_t>()[r * 4 + 1 + a] += shift[a];
  ops::ConvOptions o;
  o.kernel_size = {3, 3, 3};
  o.stride = {2, 2, 2};
  o.expand = true;
  Array b = to_array(w["n0.bias"]);
  SparseTensor full = ops::conv3d(SparseTensor(moved, feats_), to_array(w["n0.weight"]), o, &b);
  Array rows = ops::crop_rows(full.coords(), {0, 0, 0}, {4, 5, 3});
  const std::int64_t k = rows.dim(0);
  ASSERT_GT(k, 0);
  ASSERT_LT(k, full.size());  // the crop removes rows: not vacuous
  ASSERT_EQ(out[0].size(), k);
  const std::int64_t* r = rows.data<std::int64_t>();
  bool coords_equal = true, feats_equal = true;
  for (std::int64_t i = 0; i < k; ++i) {
    coords_equal &= std::memcmp(out[0].coords().data<std::int32_t>() + 4 * i,
                                full.coords().data<std::int32_t>() + 4 * r[i], 16) == 0;
    feats_equal &= std::memcmp(out[0].feats().data<float>() + 5 * i, full.feats().data<float>() + 5 * r[i],
                               5 * sizeof(float)) == 0;
  }
  EXPECT_TRUE(coords_equal);
  EXPECT_TRUE(feats_equal);
  EXPECT_EQ(out[0].stride(), (lattice::Int3{2, 2, 2}));

  write(replaced(kWindowGraph, "\"crop\": [4, 5, 3]", "\"crop\": null"), w);  // no crop: conv3d as is
  std::vector<SparseTensor> uncropped = lattice::Runtime::load(dir()).run(x);
  EXPECT_TRUE(same_bits(uncropped[0].coords(), full.coords()));
  EXPECT_TRUE(same_bits(uncropped[0].feats(), full.feats()));

  write(replaced(kWindowGraph, "\"version\": 3", "\"version\": 2"), w);
  expect_value_error([&] { lattice::Runtime::load(dir()); }, "window_conv3d (version 3)");
  write(replaced(kWindowGraph, "\"shift\": [1, -1, 0],", ""), w);
  expect_value_error([&] { lattice::Runtime::load(dir()); }, "shift");
}

}  // namespace
