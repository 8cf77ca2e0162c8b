// lattice_consumer: a program outside the lattice tree, built against an installed lattice with
// find_package(lattice) (examples/consumer/CMakeLists.txt). It checks its own numbers and exits
// 1 on a wrong one, so ctest install_consumer can run it:
//
//   1. a submanifold convolution through the public op API, against values worked out by hand;
//   2. a packed int8 Linear through the public quantized API (lattice/ops/quantized.h);
//   3. lattice::Runtime on an exported-format directory this program writes itself (graph.json +
//      weights.safetensors, docs/deploy.md): voxelize a 4-point scan as the graph's metadata
//      says, run Linear -> ReLU, compare every point's logits with the hand-computed ones; it
//      also writes the scan (scan.bin) and the labels the runner must produce (expected.label)
//      so the test can run the installed lattice-run on the same directory.
//
//   lattice_consumer OUT_DIR          (OUT_DIR is created; default ./consumer_net)
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <lattice/lattice.h>
#include <lattice/ops/quantized.h>
#include <lattice/runtime.h>

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  std::printf("  %-58s %s\n", what.c_str(), ok ? "ok" : "WRONG");
  if (!ok) ++failures;
}

bool near(float a, double b) { return std::abs(a - b) <= 1e-6 * std::max(1.0, std::abs(b)); }

void write_bytes(const std::string& path, const void* data, std::size_t n) {
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
}

// safetensors: u64 little-endian header length, JSON header, raw little-endian buffers.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, std::vector<float>>>& ts,
                       const std::vector<std::string>& shapes) {
  std::string header = "{";
  std::size_t offset = 0;
  for (std::size_t i = 0; i < ts.size(); ++i) {
    const std::size_t bytes = ts[i].second.size() * 4;
    header += (i ? "," : "") + std::string("\"") + ts[i].first + "\":{\"dtype\":\"F32\",\"shape\":" + shapes[i] +
              ",\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + bytes) + "]}";
    offset += bytes;
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::ofstream f(path, std::ios::binary);
  const std::uint64_t n = header.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f.write(header.data(), static_cast<std::streamsize>(n));
  for (const auto& t : ts) f.write(reinterpret_cast<const char*>(t.second.data()), static_cast<std::streamsize>(t.second.size() * 4));
}

void check_conv() {
  using namespace lattice;
  // Two neighbours along x, one channel. The weight is symmetric under offset negation (centre 2,
  // the two x neighbours 5, the rest 0), so the result does not depend on the offset convention:
  // y0 = 2*f0 + 5*f1 = 12, y1 = 2*f1 + 5*f0 = 9.
  SparseTensor x(Array::from_vector(std::vector<std::int32_t>{0, 0, 0, 0, 0, 1, 0, 0}, {2, 4}),
                 Array::from_vector(std::vector<float>{1.0f, 2.0f}, {2, 1}));
  std::vector<float> w(27, 0.0f);  // kernel-major (27, 1, 1): row (dx*3 + dy)*3 + dz, d in 0..2
  w[(1 * 3 + 1) * 3 + 1] = 2.0f;
  w[(0 * 3 + 1) * 3 + 1] = 5.0f;
  w[(2 * 3 + 1) * 3 + 1] = 5.0f;
  ops::ConvOptions options;
  options.kernel_size = {3, 3, 3};
  SparseTensor y = ops::subm_conv3d(x, Array::from_vector(w, {27, 1, 1}), options);
  const float* v = y.feats().contiguous().data<float>();
  expect(y.key() == x.key() && y.size() == 2 && near(v[0], 12.0) && near(v[1], 9.0),
         "subm_conv3d (public op API)");
}

void check_quantized_linear() {
  using namespace lattice;
  // int8, group 32, one output: codes j = 0..31 packed 4 per uint32 word (LSB first), scale 0.5,
  // bias -1, so w_j = 0.5 j - 1; features all 1: y = 0.5 * 496 - 32 = 216.
  std::vector<std::int32_t> words(8);
  for (int wd = 0; wd < 8; ++wd) {
    std::uint32_t u = 0;
    for (int e = 0; e < 4; ++e) u |= static_cast<std::uint32_t>(wd * 4 + e) << (8 * e);
    std::memcpy(&words[wd], &u, 4);
  }
  ops::QuantizedWeight q;
  q.packed = Array::from_vector(words, {1, 8});
  q.scales = Array::from_vector(std::vector<float>{0.5f}, {1, 1});
  q.biases = Array::from_vector(std::vector<float>{-1.0f}, {1, 1});
  q.bits = 8;
  q.group_size = 32;
  q.layout = ops::QuantizedLayout::linear;
  q.shape = {1, 32};
  Array y = ops::quantized_linear(Array::from_vector(std::vector<float>(32, 1.0f), {1, 32}), q, nullptr);
  expect(y.dim(0) == 1 && y.dim(1) == 1 && near(y.contiguous().data<float>()[0], 216.0),
         "quantized_linear, packed int8 (public quantized API)");
}

void check_runtime(const std::string& dir) {
  using namespace lattice;
  std::filesystem::create_directories(dir);
  // Features per point: x and intensity (metadata.voxelize), mean per 1 m voxel; network
  // fc: W = [[1, 0], [0, 1], [-1, -1]], b = [0, 0.5, 0], then ReLU:
  //   logits = (relu(x), relu(i + 0.5), relu(-x - i)).
  const char* graph = R"json({
 "format": "lattice.graph", "version": 1, "dtype": "float32", "producer": "lattice_consumer (by hand)",
 "inputs": [{"name": "input", "value": "v0", "channels": 2, "stride": [1, 1, 1]}],
 "outputs": [{"name": "logits", "value": "v2"}],
 "coords": {"c0": {"stride": [1, 1, 1]}},
 "values": {"v0": {"coords": "c0", "channels": 2}, "v1": {"coords": "c0", "channels": 3},
            "v2": {"coords": "c0", "channels": 3}},
 "nodes": [
  {"name": "fc", "op": "linear", "inputs": ["v0"], "output": "v1", "attrs": {},
   "weights": {"weight": "n0.weight", "bias": "n0.bias"}},
  {"name": "act", "op": "relu", "inputs": ["v1"], "output": "v2", "attrs": {}, "weights": {}}],
 "metadata": {"voxelize": {"voxel_size": 1.0, "origin": 0.0, "reduction": "mean",
                           "features": [{"source": "x"}, {"source": "intensity"}]}}
}
)json";
  write_bytes(dir + "/graph.json", graph, std::strlen(graph));
  write_safetensors(dir + "/weights.safetensors",
                    {{"n0.bias", {0.0f, 0.5f, 0.0f}}, {"n0.weight", {1.0f, 0.0f, 0.0f, 1.0f, -1.0f, -1.0f}}},
                    {"[3]", "[3, 2]"});
  // Points 0 and 3 share voxel (2, 0, 0): mean x 2.5, mean intensity 0.5 -> (2.5, 1.0, 0), class 0.
  const std::vector<float> pts = {2.25f, 0.5f, 0.5f, 0.25f,  -3.5f, 0.5f, 0.5f, 1.0f,
                                  0.5f,  5.5f, 0.5f, 2.0f,   2.75f, 0.1f, 0.9f, 0.75f};
  const std::vector<std::vector<double>> want = {{2.5, 1.0, 0.0}, {0.0, 1.5, 2.5}, {0.5, 2.5, 0.0}, {2.5, 1.0, 0.0}};
  const std::vector<std::uint32_t> labels = {0, 2, 1, 0};
  write_bytes(dir + "/scan.bin", pts.data(), pts.size() * 4);
  write_bytes(dir + "/expected.label", labels.data(), labels.size() * 4);

  Runtime net = Runtime::load(dir);
  expect(net.num_nodes() == 2 && net.input_channels() == 2 && net.output_names().at(0) == "logits",
         "Runtime::load (graph.json + weights.safetensors)");
  VoxelizedScan scan = net.voxelize(Array::from_vector(pts, {4, 4}));
  expect(scan.tensor.size() == 3 && scan.inverse.dim(0) == 4, "Runtime::voxelize: 4 points -> 3 voxels");
  std::vector<SparseTensor> out = net.run(scan.tensor);
  Array logits = out.at(0).feats().contiguous();
  const std::int64_t* inv = scan.inverse.data<std::int64_t>();
  bool ok = out.size() == 1 && logits.dim(0) == 3 && logits.dim(1) == 3;
  for (int p = 0; ok && p < 4; ++p)
    for (int c = 0; c < 3; ++c) ok = ok && near(logits.data<float>()[inv[p] * 3 + c], want[p][c]);
  expect(ok, "Runtime::run: per-point logits = hand-computed values");
  std::map<std::string, Array> w = read_safetensors(dir + "/weights.safetensors");
  expect(w.size() == 2 && w.at("n0.weight").dim(0) == 3 && w.at("n0.weight").data<float>()[4] == -1.0f,
         "read_safetensors");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "consumer_net";
  std::printf("lattice_consumer (lattice %s):\n", LATTICE_CONSUMER_VERSION);
  try {
    check_conv();
    check_quantized_linear();
    check_runtime(dir);
  } catch (const std::exception& e) {
    std::printf("lattice_consumer: exception: %s\n", e.what());
    return 1;
  }
  if (failures) {
    std::printf("lattice_consumer: %d check(s) WRONG\n", failures);
    return 1;
  }
  std::printf("lattice_consumer: all checks passed\n");
  return 0;
}
