// lattice::Runtime: runs a network exported by `lattice.export` (graph.json, schema
// "lattice.graph" version 1, 2 or 3, + weights.safetensors; docs/deploy.md) with the C++ ops of
// lattice, no Python and no libtorch.
//
//   lattice::Runtime net = lattice::Runtime::load("out/net");            // CPU
//   lattice::Runtime gpu = lattice::Runtime::load("out/net", lattice::Device::cuda());
//   std::vector<lattice::SparseTensor> outs = net.run(coords, feats);    // (N, 4) i32, (N, C) f32
//
// Nodes run in graph order: convolutions through lattice::ops (the same routes the Python front
// end picks, so CPU results equal `lattice.load_exported` bit for bit), Linear as a kernel-1
// submanifold conv; nodes with packed int8 / int4 weights (version 2, attrs["quantized"])
// through the public quantized API (ops::quantized_conv_forward / ops::quantized_linear, as
// lattice.nn's Quantized* modules), window_conv3d nodes (version 3: lattice.models.WindowConv3d,
// the spconv window: input translated by attrs.shift, conv3d with padding 0 and expand, rows kept
// inside [0, attrs.crop) when crop is set) as translate + ops::conv3d + ops::crop_rows, element-wise nodes (scale_shift, activations, add/sub/mul, cat, layer_norm)
// in this layer. On CUDA the convolutions run on the device; the element-wise nodes of graph
// version 1 run on the host (a device -> host -> device copy per node; see docs/deploy.md).
//
// Errors: lattice::ValueError "[Runtime] <what>: expected ..., got ..." for a malformed or
// unsupported directory (unknown format/version/op, missing or mis-shaped weights, truncated
// safetensors), for inputs of the wrong shape, and when a value's coordinates differ from the
// ones the graph recorded for it.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lattice/core/array.h"
#include "lattice/core/device.h"
#include "lattice/route/problem.h"
#include "lattice/tensor/sparse_tensor.h"

namespace lattice {

// One per-point input feature of metadata["voxelize"]["features"]: (column + add) / divide in
// float32; source "x" | "y" | "z" | "intensity", or "offset_x|y|z" = the point's place in its
// voxel, float(p / voxel_size - floor(p / voxel_size) - 0.5) computed in double.
struct PointFeature {
  std::string source;
  double add = 0.0;
  double divide = 1.0;
};

// metadata["voxelize"]: how lattice-run turns a scan into the network input.
struct VoxelizeSpec {
  bool present = false;  // false when the graph has no metadata["voxelize"]
  std::array<double, 3> voxel_size{1.0, 1.0, 1.0};
  std::array<double, 3> origin{0.0, 0.0, 0.0};
  PointReduction reduction = PointReduction::mean;
  std::vector<PointFeature> features;
};

struct VoxelizedScan {
  SparseTensor tensor;  // voxels (M, 4) at stride 1 with the reduced features (M, C) f32, CPU
  Array inverse;        // (P) int64: the voxel row of each point
};

struct NodeTiming {
  std::string name;
  std::string op;
  double seconds = 0.0;
};

class Runtime {
 public:
  // Reads `directory`/graph.json and `directory`/weights.safetensors; weights are copied to
  // `device` once.
  static Runtime load(const std::string& directory, Device device = Device::cpu());

  // Runs the graph. Inputs on the host are copied to the runtime's device; outputs stay there.
  // `timings` (optional) receives one entry per node (host wall time; on CUDA synchronised per
  // node so the numbers mean something).
  std::vector<SparseTensor> run(const SparseTensor& input, std::vector<NodeTiming>* timings = nullptr) const;
  // coords (N, 4) int32 (batch, x, y, z) at the graph input's stride, feats (N, C) float32.
  std::vector<SparseTensor> run(const Array& coords, const Array& feats,
                                std::vector<NodeTiming>* timings = nullptr) const;

  // Per-point features and voxelization as metadata["voxelize"] says (ValueError when absent).
  // points: (P, 4) float32 (x, y, z, intensity) on the CPU.
  VoxelizedScan voxelize(const Array& points) const;

  Device device() const;
  std::int64_t input_channels() const;
  std::vector<std::string> output_names() const;
  std::size_t num_nodes() const;
  int version() const;  // the graph's schema version (1, 2 or 3)
  const VoxelizeSpec& voxelize_spec() const;
  std::string metadata_json() const;  // metadata as JSON text ("{}" when none)

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

// A safetensors file (8-byte little-endian header length, JSON header, raw little-endian
// buffers): name -> contiguous CPU Array. Dtypes F32, F64, F16, BF16, I32, I64, U8; others raise
// ValueError.
std::map<std::string, Array> read_safetensors(const std::string& path);

}  // namespace lattice
