// lattice::Runtime (include/lattice/runtime.h): graph.json + weights.safetensors -> lattice::ops.
// Uses only the public C++ API (include/lattice); JSON through nlohmann-json (Debian's
// nlohmann-json3-dev).
#include "lattice/runtime.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "lattice/core/error.h"
#include "lattice/ops/conv.h"
#include "lattice/ops/coords.h"
#include "lattice/ops/point_voxel.h"
#include "lattice/ops/pool.h"
#include "lattice/ops/quantize.h"
#include "lattice/ops/quantized.h"

namespace lattice {
namespace {

using json = nlohmann::json;
constexpr const char* kOp = "Runtime";
constexpr const char* kFormat = "lattice.graph";
constexpr int kVersion = 3;  // newest schema read (versions 1 and 2 files are read as well)

[[noreturn]] void fail(const std::string& what, const std::string& expected, const std::string& got) {
  throw_value_error(kOp, what, expected, got);
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(path, "a readable file", "a file that cannot be opened");
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// ---- safetensors --------------------------------------------------------------------------------

struct StDtype {
  const char* name;
  Dtype dtype;
};
constexpr StDtype kStDtypes[] = {{"F32", Dtype::f32}, {"F64", Dtype::f64}, {"F16", Dtype::f16},
                                 {"BF16", Dtype::bf16}, {"I32", Dtype::i32}, {"I64", Dtype::i64},
                                 {"U8", Dtype::u8}};

// ---- graph --------------------------------------------------------------------------------------

enum class Op {
  subm_conv3d, conv3d, conv_transpose3d, generative_conv_transpose3d, linear, scale_shift, relu,
  leaky_relu, gelu, silu, sigmoid, tanh_, softplus, layer_norm, add, sub, mul, cat,
  max_pool3d, avg_pool3d, sum_pool3d,  // version 2
  window_conv3d                        // version 3
};
const std::pair<const char*, Op> kOps[] = {
    {"subm_conv3d", Op::subm_conv3d}, {"conv3d", Op::conv3d}, {"conv_transpose3d", Op::conv_transpose3d},
    {"generative_conv_transpose3d", Op::generative_conv_transpose3d}, {"linear", Op::linear},
    {"scale_shift", Op::scale_shift}, {"relu", Op::relu}, {"leaky_relu", Op::leaky_relu}, {"gelu", Op::gelu},
    {"silu", Op::silu}, {"sigmoid", Op::sigmoid}, {"tanh", Op::tanh_}, {"softplus", Op::softplus},
    {"layer_norm", Op::layer_norm}, {"add", Op::add}, {"sub", Op::sub}, {"mul", Op::mul}, {"cat", Op::cat},
    {"max_pool3d", Op::max_pool3d}, {"avg_pool3d", Op::avg_pool3d}, {"sum_pool3d", Op::sum_pool3d},
    {"window_conv3d", Op::window_conv3d}};

bool is_pool(Op op) { return op == Op::max_pool3d || op == Op::avg_pool3d || op == Op::sum_pool3d; }

bool is_conv(Op op) {
  return op == Op::subm_conv3d || op == Op::conv3d || op == Op::conv_transpose3d ||
         op == Op::generative_conv_transpose3d || op == Op::linear || op == Op::window_conv3d;
}

struct Node {
  std::string name;
  std::string op_name;
  Op op{};
  std::vector<int> inputs;  // value slots
  int output = -1;
  ops::ConvOptions conv;
  ops::PoolOptions pool;
  PoolMode pool_mode = PoolMode::max;
  Array weight, bias, scale, shift;  // on the runtime's device (conv) / host (element-wise)
  bool packed = false;               // attrs["quantized"]: weight is `q` (graph version 2)
  ops::QuantizedWeight q;
  RelationKind kind = RelationKind::submanifold;
  double slope = 0.01, beta = 1.0, threshold = 20.0, eps = 1e-5;
  bool gelu_tanh = false;
  // window_conv3d (version 3): input translation, and the output grid [0, crop_hi) when `crop`
  Int3 window_shift{0, 0, 0};
  bool crop = false;
  Int3 crop_hi{0, 0, 0};
};

Int3 int3(const json& j, const std::string& what) {
  if (!j.is_array() || j.size() != 3) fail(what, "3 integers", j.dump());
  return {j[0].get<std::int32_t>(), j[1].get<std::int32_t>(), j[2].get<std::int32_t>()};
}

std::array<double, 3> double3(const json& j, const std::string& what) {
  if (j.is_number()) return {j.get<double>(), j.get<double>(), j.get<double>()};
  if (!j.is_array() || j.size() != 3) fail(what, "a number or 3 numbers", j.dump());
  return {j[0].get<double>(), j[1].get<double>(), j[2].get<double>()};
}

std::string shape_str(const Shape& s) { return format_shape(s); }

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// ---- element-wise kernels (host, f32) -----------------------------------------------------------

Array host_f32(const Array& a) { return a.to(Device::cpu()).contiguous(); }

template <class F>
Array map_rows(const Array& x, F&& f) {  // y = f(x) element-wise
  Array in = host_f32(x);
  Array out = Array::empty(in.shape(), Dtype::f32);
  const float* p = in.data<float>();
  float* q = out.data<float>();
  const std::int64_t n = in.numel();
#pragma omp parallel for schedule(static) if (n > 65536)
  for (std::int64_t i = 0; i < n; ++i) q[i] = f(p[i]);
  return out;
}

// window_conv3d: x with every (x, y, z) coordinate moved by `shift` (same features, a new coordinate
// set; lattice.models.translate).
SparseTensor translate(const SparseTensor& x, const Int3& shift) {
  if (shift[0] == 0 && shift[1] == 0 && shift[2] == 0) return x;
  Array c = x.coords().to(Device::cpu()).contiguous().clone();
  auto* p = c.data<std::int32_t>();
  const std::int64_t n = c.dim(0);
  for (std::int64_t i = 0; i < n; ++i)
    for (int a = 0; a < 3; ++a) p[4 * i + 1 + a] += shift[a];
  return SparseTensor(c.to(x.coords().device()), x.feats(), x.stride(), x.coordinate_set()->batch_counts());
}

// window_conv3d: the rows of y with 0 <= (x, y, z) < hi, in order (lattice.ops.crop: y itself
// when every row is kept, else a new coordinate set with batch_counts recounted when y has them).
SparseTensor crop_box(const SparseTensor& y, const Int3& hi) {
  Array rows = ops::crop_rows(y.coords(), Int3{0, 0, 0}, hi).to(Device::cpu()).contiguous();
  const std::int64_t k = rows.dim(0);
  if (k == y.size()) return y;
  const Array c = y.coords().to(Device::cpu()).contiguous();
  const Array f = host_f32(y.feats());
  const std::int64_t ch = f.dim(1);
  Array oc = Array::empty({k, 4}, Dtype::i32);
  Array of = Array::empty({k, ch}, Dtype::f32);
  const auto* r = rows.data<std::int64_t>();
  const auto* cp = c.data<std::int32_t>();
  const float* fp = f.data<float>();
  auto* ocp = oc.data<std::int32_t>();
  float* ofp = of.data<float>();
  for (std::int64_t i = 0; i < k; ++i) {
    std::memcpy(ocp + 4 * i, cp + 4 * r[i], 4 * sizeof(std::int32_t));
    std::memcpy(ofp + ch * i, fp + ch * r[i], static_cast<std::size_t>(ch) * sizeof(float));
  }
  std::optional<std::vector<std::int64_t>> counts;
  if (y.coordinate_set()->batch_counts()) {
    counts = std::vector<std::int64_t>(y.coordinate_set()->batch_counts()->size(), 0);
    for (std::int64_t i = 0; i < k; ++i) {
      const auto b = static_cast<std::size_t>(ocp[4 * i]);
      if (b >= counts->size()) counts->resize(b + 1, 0);
      ++(*counts)[b];
    }
  }
  const Device d = y.feats().device();
  return SparseTensor(oc.to(d), of.to(d), y.stride(), counts);
}

}  // namespace

// ---- safetensors reader -------------------------------------------------------------------------

std::map<std::string, Array> read_safetensors(const std::string& path) {
  static_assert(std::endian::native == std::endian::little, "safetensors buffers are little endian");
  const std::string bytes = read_file(path);
  if (bytes.size() < 8) fail(path, "a safetensors file of at least 8 bytes", std::to_string(bytes.size()) + " bytes");
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  if (n > bytes.size() - 8)
    fail(path, "a header of at most " + std::to_string(bytes.size() - 8) + " bytes", std::to_string(n) + " bytes");
  json header;
  try {
    header = json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  } catch (const json::exception& e) {
    fail(path, "a JSON safetensors header", e.what());
  }
  if (!header.is_object()) fail(path, "a JSON object header", header.dump().substr(0, 80));
  const std::uint64_t data_size = bytes.size() - 8 - n;
  const char* base = bytes.data() + 8 + n;
  std::map<std::string, Array> out;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string where = path + ": " + name;
    const std::string dt = info.value("dtype", "");
    const StDtype* found = nullptr;
    for (const auto& d : kStDtypes)
      if (dt == d.name) found = &d;
    if (!found) fail(where, "dtype F32, F64, F16, BF16, I32, I64 or U8", dt.empty() ? "none" : dt);
    Shape shape;
    for (const auto& s : info.at("shape")) shape.push_back(s.get<std::int64_t>());
    const auto& off = info.at("data_offsets");
    const std::uint64_t lo = off.at(0).get<std::uint64_t>(), hi = off.at(1).get<std::uint64_t>();
    std::int64_t numel = 1;
    for (auto s : shape) numel *= s;
    if (lo > hi || hi > data_size || hi - lo != static_cast<std::uint64_t>(numel) * size_of(found->dtype))
      fail(where, "data_offsets inside the " + std::to_string(data_size) + "-byte buffer matching shape " +
                      shape_str(shape),
           "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    Array a = Array::empty(shape, found->dtype);
    if (hi > lo) std::memcpy(a.raw_data(), base + lo, hi - lo);
    out.emplace(name, std::move(a));
  }
  return out;
}

// ---- Runtime ------------------------------------------------------------------------------------

struct Runtime::Impl {
  Device device;
  json graph;
  std::vector<Node> nodes;
  int input_slot = -1;
  std::int64_t input_channels = 0;
  Int3 input_stride{1, 1, 1};
  std::vector<int> output_slots;
  std::vector<std::string> output_names;
  std::vector<std::int64_t> slot_channels;
  std::vector<int> slot_coords;  // coordinate set id of each value slot
  int n_coords = 0;
  int version = 1;
  VoxelizeSpec voxelize;

  SparseTensor run_node(const Node& n, const std::vector<SparseTensor>& in) const;
};

namespace {

Array take_weight(std::map<std::string, Array>& weights, const json& refs, const char* key, const Node& n,
                  bool required, std::initializer_list<Dtype> dtypes = {Dtype::f32}) {
  if (!refs.contains(key)) {
    if (required) fail("node " + n.name + " " + key, "a weight reference", "none");
    return {};
  }
  const std::string ref = refs[key].get<std::string>();
  auto it = weights.find(ref);
  if (it == weights.end()) fail("node " + n.name + " " + key, "tensor " + ref + " in weights.safetensors", "none");
  if (std::find(dtypes.begin(), dtypes.end(), it->second.dtype()) == dtypes.end()) {
    std::string want;
    for (Dtype d : dtypes) want += (want.empty() ? "" : " or ") + std::string(to_string(d));
    fail("node " + n.name + " " + key, want, std::string(to_string(it->second.dtype())));
  }
  return it->second;
}

void expect_shape(const Node& n, const char* what, const Array& a, const Shape& shape) {
  if (a.shape() != shape)
    fail("node " + n.name + " " + what, "shape " + shape_str(shape), shape_str(a.shape()));
}

// attrs["quantized"] + weights packed / scales / biases: the packed weight as lattice.QuantizedWeight
// holds it. Layout linear for a Linear node, dense_5d (C_out, Kx, Ky, Kz, C_in) for a convolution;
// the quantized ops check the storage shapes against the logical one.
void take_packed(Node& n, std::map<std::string, Array>& weights, const json& refs, const json& qa,
                 std::int64_t c_in, std::int64_t c_out) {
  const std::string where = "node " + n.name + " attrs.quantized";
  n.packed = true;
  n.q.packed = take_weight(weights, refs, "packed", n, true, {Dtype::i32});
  n.q.scales = take_weight(weights, refs, "scales", n, true, {Dtype::f32, Dtype::f16, Dtype::bf16});
  n.q.biases = take_weight(weights, refs, "biases", n, true, {Dtype::f32, Dtype::f16, Dtype::bf16});
  n.q.bits = qa.at("bits").get<int>();
  n.q.group_size = qa.at("group_size").get<int>();
  const std::string layout = qa.at("layout").get<std::string>();
  n.q.shape = qa.at("shape").get<std::vector<std::int64_t>>();
  if (n.op == Op::linear) {
    if (layout != "linear") fail(where + ".layout", "linear (a Linear node)", layout);
    n.q.layout = ops::QuantizedLayout::linear;
    if (n.q.shape != std::vector<std::int64_t>{c_out, c_in})
      fail(where + ".shape", shape_str({c_out, c_in}), shape_str(Shape(n.q.shape.begin(), n.q.shape.end())));
  } else {
    if (layout != "dense_5d") fail(where + ".layout", "dense_5d (a convolution node)", layout);
    n.q.layout = ops::QuantizedLayout::dense_5d;
    const auto& k = n.conv.kernel_size;
    const std::vector<std::int64_t> want{c_out, k[0], k[1], k[2], c_in};
    if (n.q.shape != want)
      fail(where + ".shape", shape_str(Shape(want.begin(), want.end())),
           shape_str(Shape(n.q.shape.begin(), n.q.shape.end())));
  }
}

VoxelizeSpec parse_voxelize(const json& meta) {
  VoxelizeSpec spec;
  if (!meta.is_object() || !meta.contains("voxelize")) return spec;
  const json& v = meta["voxelize"];
  spec.present = true;
  spec.voxel_size = double3(v.at("voxel_size"), "metadata.voxelize.voxel_size");
  if (v.contains("origin")) spec.origin = double3(v["origin"], "metadata.voxelize.origin");
  const std::string red = v.value("reduction", "mean");
  if (red == "mean") spec.reduction = PointReduction::mean;
  else if (red == "sum") spec.reduction = PointReduction::sum;
  else if (red == "max") spec.reduction = PointReduction::max;
  else fail("metadata.voxelize.reduction", "mean, sum or max", red);
  static const char* sources[] = {"x", "y", "z", "intensity", "offset_x", "offset_y", "offset_z"};
  for (const auto& f : v.at("features")) {
    PointFeature p{f.at("source").get<std::string>(), f.value("add", 0.0), f.value("divide", 1.0)};
    if (std::find_if(std::begin(sources), std::end(sources), [&](const char* s) { return p.source == s; }) ==
        std::end(sources))
      fail("metadata.voxelize.features.source", "x, y, z, intensity, offset_x, offset_y or offset_z", p.source);
    spec.features.push_back(p);
  }
  if (spec.features.empty()) fail("metadata.voxelize.features", "at least one feature", "none");
  return spec;
}

}  // namespace

Runtime Runtime::load(const std::string& directory, Device device) {
  auto impl = std::make_shared<Impl>();
  impl->device = device;
  const std::string gpath = directory + "/graph.json";
  try {
    impl->graph = json::parse(read_file(gpath));
  } catch (const json::exception& e) {
    fail(gpath, "valid JSON", e.what());
  }
  const json& g = impl->graph;
  try {
    if (g.value("format", "") != kFormat) fail(gpath + " format", kFormat, g.value("format", "none"));
    const int version = g.value("version", -1);
    if (version < 1 || version > kVersion)
      fail(gpath + " version", "1 to " + std::to_string(kVersion), std::to_string(version));
    impl->version = version;
    if (g.value("dtype", "float32") != "float32") fail(gpath + " dtype", "float32", g.value("dtype", ""));
    auto weights = read_safetensors(directory + "/weights.safetensors");

    std::unordered_map<std::string, int> slots, coord_ids;
    auto coords_id = [&](const std::string& c) {
      auto [it, fresh] = coord_ids.emplace(c, static_cast<int>(coord_ids.size()));
      (void)fresh;
      return it->second;
    };
    const json& values = g.at("values");
    for (const auto& [name, info] : values.items()) {
      slots.emplace(name, static_cast<int>(slots.size()));
      impl->slot_channels.push_back(info.at("channels").get<std::int64_t>());
      impl->slot_coords.push_back(coords_id(info.at("coords").get<std::string>()));
    }
    auto slot = [&](const std::string& v, const std::string& where) {
      auto it = slots.find(v);
      if (it == slots.end()) fail(where, "a value listed in \"values\"", v);
      return it->second;
    };
    if (g.at("inputs").size() != 1) fail(gpath + " inputs", "exactly one input", std::to_string(g["inputs"].size()));
    const json& in = g["inputs"][0];
    impl->input_slot = slot(in.at("value").get<std::string>(), "inputs[0]");
    impl->input_channels = in.at("channels").get<std::int64_t>();
    if (in.contains("stride")) impl->input_stride = int3(in["stride"], "inputs[0].stride");
    std::vector<bool> defined(slots.size(), false);
    defined[impl->input_slot] = true;

    for (const json& jn : g.at("nodes")) {
      Node n;
      n.name = jn.value("name", "?");
      n.op_name = jn.at("op").get<std::string>();
      auto it = std::find_if(std::begin(kOps), std::end(kOps), [&](const auto& p) { return n.op_name == p.first; });
      if (it == std::end(kOps)) fail("node " + n.name + " op", "an op of lattice.graph (versions 1 to 3)", n.op_name);
      if (it->second == Op::window_conv3d && version < 3)
        fail("node " + n.name + " op", "an op of graph version " + std::to_string(version), n.op_name + " (version 3)");
      n.op = it->second;
      for (const auto& v : jn.at("inputs")) {
        int s = slot(v.get<std::string>(), "node " + n.name + " inputs");
        if (!defined[s]) fail("node " + n.name + " inputs", "values computed by earlier nodes", v.get<std::string>());
        n.inputs.push_back(s);
      }
      n.output = slot(jn.at("output").get<std::string>(), "node " + n.name + " output");
      defined[n.output] = true;
      const json& a = jn.value("attrs", json::object());
      const json& refs = jn.value("weights", json::object());
      const std::size_t want = (n.op == Op::add || n.op == Op::sub || n.op == Op::mul) ? 2
                               : (n.op == Op::conv3d || n.op == Op::conv_transpose3d || is_pool(n.op)) ? 0 : 1;
      if ((want == 2 && n.inputs.size() != 2) || (want == 1 && n.op != Op::cat && n.inputs.size() != 1) ||
          (want == 0 && (n.inputs.empty() || n.inputs.size() > 2)) || n.inputs.empty())
        fail("node " + n.name + " inputs", want == 0 ? "1 or 2 values" : std::to_string(want) + " value(s)",
             std::to_string(n.inputs.size()));
      const std::int64_t c_in = impl->slot_channels[n.inputs[0]];
      const std::int64_t c_out = impl->slot_channels[n.output];
      if (is_conv(n.op)) {
        const bool packed = a.contains("quantized");
        if (!packed) n.weight = take_weight(weights, refs, "weight", n, true);
        n.bias = take_weight(weights, refs, "bias", n, false);
        if (n.op == Op::linear) {
          if (!packed) {
            expect_shape(n, "weight", n.weight, {c_out, c_in});
            n.weight = n.weight.reshape({c_out, 1, 1, 1, c_in});
          }
          n.conv.kernel_size = {1, 1, 1};
        } else {
          n.conv.kernel_size = int3(a.at("kernel_size"), "node " + n.name + " kernel_size");
          n.conv.dilation = int3(a.at("dilation"), "node " + n.name + " dilation");
          if (a.contains("stride")) n.conv.stride = int3(a["stride"], "node " + n.name + " stride");
          if (a.contains("padding")) n.conv.padding = int3(a["padding"], "node " + n.name + " padding");
          n.conv.expand = a.value("expand", false);
          if (n.op == Op::window_conv3d) {  // translate, conv3d (padding 0, expand), crop
            if (a.contains("padding")) fail("node " + n.name + " padding", "none (window_conv3d pads by its shift)",
                                            a["padding"].dump());
            n.conv.expand = true;
            n.window_shift = int3(a.at("shift"), "node " + n.name + " shift");
            if (a.contains("crop") && !a["crop"].is_null()) {
              n.crop = true;
              n.crop_hi = int3(a["crop"], "node " + n.name + " crop");
              for (int ax = 0; ax < 3; ++ax)
                if (n.crop_hi[ax] < 0) fail("node " + n.name + " crop", "non-negative sizes", a["crop"].dump());
            }
          }
          const auto& k = n.conv.kernel_size;
          if (!packed) expect_shape(n, "weight", n.weight, {c_out, k[0], k[1], k[2], c_in});
        }
        if (n.bias.defined()) expect_shape(n, "bias", n.bias, {c_out});
        if (packed) {
          take_packed(n, weights, refs, a["quantized"], c_in, c_out);
          n.q.packed = n.q.packed.to(device);
          n.q.scales = n.q.scales.to(device);
          n.q.biases = n.q.biases.to(device);
        } else {
          n.weight = n.weight.to(device);
        }
        if (n.bias.defined()) n.bias = n.bias.to(device);
        const bool target = n.inputs.size() > 1;
        n.kind = n.op == Op::window_conv3d      ? RelationKind::forward
                 : n.op == Op::conv3d           ? (target ? RelationKind::target : RelationKind::forward)
                 : n.op == Op::conv_transpose3d ? (target ? RelationKind::transposed_target : RelationKind::transposed)
                 : n.op == Op::generative_conv_transpose3d ? RelationKind::generative
                                                           : RelationKind::submanifold;
      } else if (is_pool(n.op)) {
        const std::string w = "node " + n.name + " ";
        n.pool.kernel_size = int3(a.at("kernel_size"), w + "kernel_size");
        n.pool.stride = int3(a.at("stride"), w + "stride");
        n.pool.padding = int3(a.at("padding"), w + "padding");
        n.pool.dilation = int3(a.at("dilation"), w + "dilation");
        n.pool.expand = a.value("expand", false);
        n.pool_mode = n.op == Op::max_pool3d ? PoolMode::max : n.op == Op::avg_pool3d ? PoolMode::avg : PoolMode::sum;
      } else if (n.op == Op::scale_shift) {
        n.scale = take_weight(weights, refs, "scale", n, true);
        n.shift = take_weight(weights, refs, "shift", n, true);
        expect_shape(n, "scale", n.scale, {c_in});
        expect_shape(n, "shift", n.shift, {c_in});
      } else if (n.op == Op::layer_norm) {
        n.scale = take_weight(weights, refs, "weight", n, false);
        n.shift = take_weight(weights, refs, "bias", n, false);
        if (n.scale.defined()) expect_shape(n, "weight", n.scale, {c_in});
        if (n.shift.defined()) expect_shape(n, "bias", n.shift, {c_in});
        n.eps = a.value("eps", 1e-5);
      }
      if (n.op == Op::leaky_relu) n.slope = a.value("negative_slope", 0.01);
      if (n.op == Op::softplus) {
        n.beta = a.value("beta", 1.0);
        n.threshold = a.value("threshold", 20.0);
      }
      if (n.op == Op::gelu) {
        const std::string ap = a.value("approximate", "none");
        if (ap != "none" && ap != "tanh") fail("node " + n.name + " approximate", "none or tanh", ap);
        n.gelu_tanh = ap == "tanh";
      }
      if (!is_conv(n.op) && n.op != Op::cat && c_out != c_in)
        fail("node " + n.name + " output channels", std::to_string(c_in), std::to_string(c_out));
      impl->nodes.push_back(std::move(n));
    }
    for (const auto& o : g.at("outputs")) {
      impl->output_slots.push_back(slot(o.at("value").get<std::string>(), "outputs"));
      impl->output_names.push_back(o.value("name", "output"));
      if (!defined[impl->output_slots.back()]) fail("outputs", "values computed by the nodes", o["value"].dump());
    }
    if (impl->output_slots.empty()) fail(gpath + " outputs", "at least one output", "none");
    impl->n_coords = static_cast<int>(coord_ids.size());
    impl->voxelize = parse_voxelize(g.value("metadata", json::object()));
  } catch (const json::exception& e) {
    fail(gpath, "a graph of lattice.graph (versions 1 to 3)", e.what());
  }
  Runtime r;
  r.impl_ = std::move(impl);
  return r;
}

SparseTensor Runtime::Impl::run_node(const Node& n, const std::vector<SparseTensor>& in) const {
  const SparseTensor& x = in[0];
  const Array* bias = n.bias.defined() ? &n.bias : nullptr;
  if (n.op == Op::window_conv3d) {  // lattice.models.WindowConv3d.forward
    const SparseTensor t = translate(x, n.window_shift);
    SparseTensor y;
    if (n.packed) {
      const ops::ConvPlan plan = ops::plan_conv("conv3d", RelationKind::forward, t, n.conv, nullptr);
      y = SparseTensor(plan.output, ops::quantized_conv_forward(plan, t.feats(), n.q, bias));
    } else {
      y = ops::conv3d(t, n.weight, n.conv, bias, nullptr);
    }
    return n.crop ? crop_box(y, n.crop_hi) : y;
  }
  if (n.packed) {  // the public quantized API, as lattice.nn's Quantized* modules call it
    if (n.op == Op::linear) return x.with_feats(ops::quantized_linear(x.feats(), n.q, bias));
    const ops::ConvPlan plan = ops::plan_conv(n.op_name, n.kind, x, n.conv, in.size() > 1 ? &in[1] : nullptr);
    return SparseTensor(plan.output, ops::quantized_conv_forward(plan, x.feats(), n.q, bias));
  }
  if (is_pool(n.op)) {  // plan + forward, as lattice.ops.max_pool3d / avg_pool3d / sum_pool3d
    const ops::PoolPlan plan = ops::plan_pool(n.op_name, n.pool_mode, x.coordinate_set(), n.pool,
                                              in.size() > 1 ? in[1].coordinate_set() : nullptr);
    return SparseTensor(plan.output, ops::pool_forward(plan, x.feats()).out);
  }
  switch (n.op) {
    case Op::subm_conv3d:
    case Op::linear:
      return ops::subm_conv3d(x, n.weight, n.conv, bias);
    case Op::conv3d:
      return ops::conv3d(x, n.weight, n.conv, bias, in.size() > 1 ? &in[1] : nullptr);
    case Op::conv_transpose3d:
      return ops::conv_transpose3d(x, n.weight, n.conv, bias, in.size() > 1 ? &in[1] : nullptr);
    case Op::generative_conv_transpose3d:
      return ops::generative_conv_transpose3d(x, n.weight, n.conv, bias);
    default:
      break;
  }
  Array y;
  const Array& f = x.feats();
  const std::int64_t rows = f.dim(0), c = f.dim(1);
  switch (n.op) {
    case Op::scale_shift: {
      Array in_f = host_f32(f);
      y = Array::empty(in_f.shape(), Dtype::f32);
      const float *p = in_f.data<float>(), *s = n.scale.data<float>(), *t = n.shift.data<float>();
      float* q = y.data<float>();
#pragma omp parallel for schedule(static) if (rows > 4096)
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t j = 0; j < c; ++j) q[r * c + j] = p[r * c + j] * s[j] + t[j];
      break;
    }
    case Op::relu: y = map_rows(f, [](float v) { return v < 0.0f ? 0.0f : v; }); break;
    case Op::leaky_relu: {
      const float s = static_cast<float>(n.slope);
      y = map_rows(f, [s](float v) { return v > 0.0f ? v : v * s; });
      break;
    }
    case Op::sigmoid: y = map_rows(f, [](float v) { return 1.0f / (1.0f + std::exp(-v)); }); break;
    case Op::tanh_: y = map_rows(f, [](float v) { return std::tanh(v); }); break;
    case Op::silu: y = map_rows(f, [](float v) { return v / (1.0f + std::exp(-v)); }); break;
    case Op::gelu:
      if (n.gelu_tanh)
        y = map_rows(f, [](float v) {
          const float k = 0.7978845608028654f;  // sqrt(2 / pi)
          return 0.5f * v * (1.0f + std::tanh(k * (v + 0.044715f * v * v * v)));
        });
      else
        y = map_rows(f, [](float v) { return 0.5f * v * (1.0f + std::erf(v * 0.7071067811865476f)); });
      break;
    case Op::softplus: {
      const float b = static_cast<float>(n.beta), t = static_cast<float>(n.threshold);
      y = map_rows(f, [b, t](float v) { return v * b > t ? v : std::log1p(std::exp(v * b)) / b; });
      break;
    }
    case Op::layer_norm: {
      Array in_f = host_f32(f);
      y = Array::empty(in_f.shape(), Dtype::f32);
      const float* p = in_f.data<float>();
      float* q = y.data<float>();
      const float* w = n.scale.defined() ? n.scale.data<float>() : nullptr;
      const float* b = n.shift.defined() ? n.shift.data<float>() : nullptr;
#pragma omp parallel for schedule(static) if (rows > 4096)
      for (std::int64_t r = 0; r < rows; ++r) {
        double mean = 0.0, var = 0.0;
        for (std::int64_t j = 0; j < c; ++j) mean += p[r * c + j];
        mean /= static_cast<double>(c);
        for (std::int64_t j = 0; j < c; ++j) var += (p[r * c + j] - mean) * (p[r * c + j] - mean);
        const double inv = 1.0 / std::sqrt(var / static_cast<double>(c) + n.eps);
        for (std::int64_t j = 0; j < c; ++j) {
          float v = static_cast<float>((p[r * c + j] - mean) * inv);
          if (w) v *= w[j];
          if (b) v += b[j];
          q[r * c + j] = v;
        }
      }
      break;
    }
    case Op::add:
    case Op::sub:
    case Op::mul: {
      const SparseTensor& z = in[1];
      if (z.key() != x.key())
        fail("node " + n.name + " inputs", "two values on one coordinate set", "two coordinate sets");
      Array a = host_f32(f), b = host_f32(z.feats());
      if (a.shape() != b.shape()) fail("node " + n.name + " inputs", shape_str(a.shape()), shape_str(b.shape()));
      y = Array::empty(a.shape(), Dtype::f32);
      const float *p = a.data<float>(), *r = b.data<float>();
      float* q = y.data<float>();
      const std::int64_t m = a.numel();
      if (n.op == Op::add)
        for (std::int64_t i = 0; i < m; ++i) q[i] = p[i] + r[i];
      else if (n.op == Op::sub)
        for (std::int64_t i = 0; i < m; ++i) q[i] = p[i] - r[i];
      else
        for (std::int64_t i = 0; i < m; ++i) q[i] = p[i] * r[i];
      break;
    }
    case Op::cat: {
      std::int64_t total = 0;
      std::vector<Array> parts;
      for (const auto& t : in) {
        if (t.key() != x.key())
          fail("node " + n.name + " inputs", "values on one coordinate set (lattice.ops.cat)", "two coordinate sets");
        parts.push_back(host_f32(t.feats()));
        total += parts.back().dim(1);
      }
      y = Array::empty({rows, total}, Dtype::f32);
      float* q = y.data<float>();
      std::int64_t col = 0;
      for (const auto& p : parts) {
        const std::int64_t pc = p.dim(1);
        const float* s = p.data<float>();
        for (std::int64_t r = 0; r < rows; ++r) std::memcpy(q + r * total + col, s + r * pc, pc * sizeof(float));
        col += pc;
      }
      break;
    }
    default:
      fail("node " + n.name + " op", "a supported op", n.op_name);
  }
  return x.with_feats(device.is_cpu() ? y : y.to(device));
}

std::vector<SparseTensor> Runtime::run(const SparseTensor& input, std::vector<NodeTiming>* timings) const {
  const Impl& m = *impl_;
  if (input.channels() != m.input_channels)
    fail("input feats", "(N, " + std::to_string(m.input_channels) + ")", shape_str(input.feats().shape()));
  if (input.feats().dtype() != Dtype::f32)
    fail("input feats", "float32", std::string(to_string(input.feats().dtype())));
  if (input.stride() != m.input_stride)
    fail("input stride", "the exported input's stride", "another stride");
  SparseTensor x = input;
  if (!(input.feats().device() == m.device))
    x = SparseTensor(input.coords().to(m.device), input.feats().to(m.device), input.stride(),
                     input.coordinate_set()->batch_counts());
  std::vector<SparseTensor> env(m.slot_channels.size());
  std::vector<std::uint64_t> coord_keys(m.n_coords, 0);
  env[m.input_slot] = x;
  coord_keys[m.slot_coords[m.input_slot]] = x.key();
  if (timings) timings->clear();
  for (const Node& n : m.nodes) {
    const double t0 = timings ? now() : 0.0;
    std::vector<SparseTensor> in;
    in.reserve(n.inputs.size());
    for (int s : n.inputs) in.push_back(env[s]);
    SparseTensor y = m.run_node(n, in);
    if (y.channels() != m.slot_channels[n.output])
      fail("node " + n.name + " output", std::to_string(m.slot_channels[n.output]) + " channels",
           std::to_string(y.channels()));
    std::uint64_t& key = coord_keys[m.slot_coords[n.output]];
    if (key == 0) key = y.key();
    else if (key != y.key())
      fail("node " + n.name + " output", "the coordinate set the graph recorded for it",
           "another coordinate set (the graph and this build of lattice disagree)");
    env[n.output] = std::move(y);
    if (timings) {
      if (!m.device.is_cpu()) (void)env[n.output].feats().to(Device::cpu());  // waits for the device
      timings->push_back({n.name, n.op_name, now() - t0});
    }
  }
  std::vector<SparseTensor> out;
  for (int s : m.output_slots) out.push_back(env[s]);
  return out;
}

std::vector<SparseTensor> Runtime::run(const Array& coords, const Array& feats, std::vector<NodeTiming>* timings) const {
  return run(SparseTensor(coords, feats, impl_->input_stride), timings);
}

VoxelizedScan Runtime::voxelize(const Array& points_in) const {
  const VoxelizeSpec& spec = impl_->voxelize;
  if (!spec.present) fail("metadata.voxelize", "a voxelization recipe in graph.json", "none");
  if (points_in.ndim() != 2 || points_in.dim(1) < 4 || points_in.dtype() != Dtype::f32)
    fail("points", "(P, 4) float32 (x, y, z, intensity)", shape_str(points_in.shape()));
  Array pts = points_in.to(Device::cpu()).contiguous();
  const std::int64_t P = pts.dim(0), stride = pts.dim(1);
  const float* p = pts.data<float>();
  Array xyz = Array::empty({P, 3}, Dtype::f32);
  float* xq = xyz.data<float>();
  for (std::int64_t i = 0; i < P; ++i)
    for (int a = 0; a < 3; ++a) xq[i * 3 + a] = p[i * stride + a];
  const std::int64_t C = static_cast<std::int64_t>(spec.features.size());
  if (C != impl_->input_channels)
    fail("metadata.voxelize.features", std::to_string(impl_->input_channels) + " features (the input channels)",
         std::to_string(C));
  Array feats = Array::empty({P, C}, Dtype::f32);
  float* fq = feats.data<float>();
  for (std::int64_t j = 0; j < C; ++j) {
    const PointFeature& f = spec.features[j];
    const float add = static_cast<float>(f.add), div = static_cast<float>(f.divide);
    int col = 0;
    bool offset = false;
    if (f.source == "x") col = 0;
    else if (f.source == "y") col = 1;
    else if (f.source == "z") col = 2;
    else if (f.source == "intensity") col = 3;
    else {
      offset = true;
      col = f.source.back() - 'x';
    }
    for (std::int64_t i = 0; i < P; ++i) {
      float v;
      if (offset) {
        const double s = static_cast<double>(p[i * stride + col]) / spec.voxel_size[col];
        v = static_cast<float>(s - std::floor(s) - 0.5);
      } else {
        v = p[i * stride + col];
      }
      if (f.add != 0.0) v = v + add;
      if (f.divide != 1.0) v = v / div;
      fq[i * C + j] = v;
    }
  }
  ops::QuantizeOptions q;
  q.voxel_size = spec.voxel_size;
  q.origin = spec.origin;
  ops::PointGrouping grouping = ops::group_points(xyz, q, nullptr, "lattice-run voxelize");
  ops::VoxelizeForward vf = ops::voxelize_forward(grouping, feats, spec.reduction);
  return {SparseTensor(grouping.voxels, vf.feats), grouping.inverse};
}

Device Runtime::device() const { return impl_->device; }
std::int64_t Runtime::input_channels() const { return impl_->input_channels; }
std::vector<std::string> Runtime::output_names() const { return impl_->output_names; }
std::size_t Runtime::num_nodes() const { return impl_->nodes.size(); }
int Runtime::version() const { return impl_->version; }
const VoxelizeSpec& Runtime::voxelize_spec() const { return impl_->voxelize; }
std::string Runtime::metadata_json() const { return impl_->graph.value("metadata", json::object()).dump(); }

}  // namespace lattice
