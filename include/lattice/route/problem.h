// Problem descriptions handed to the route layer: plain numbers and vocabulary, no tensors.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "lattice/core/device.h"
#include "lattice/core/dtype.h"
#include "lattice/core/vocab.h"

namespace lattice {

// One convolution pass over a built relation.
struct ConvProblem {
  std::string op = "conv3d";  // public op name: conv3d, subm_conv3d, conv_transpose3d, ...
  RelationKind relation = RelationKind::forward;
  ConvPass pass = ConvPass::forward;
  Dtype dtype = Dtype::f32;
  Device device;
  std::int64_t n_in = 0;
  std::int64_t n_out = 0;
  std::int64_t c_in = 0;
  std::int64_t c_out = 0;
  std::int64_t kernel_volume = 1;
  std::int64_t n_edges = 0;
  bool identity_relation = false;  // edges are exactly (i, i, 0) for every row: a plain matmul
  bool deterministic = true;       // bitwise-reproducible results required
  bool allow_tf32 = false;         // fp32 may use tf32 tensor cores
};
std::string to_string(const ConvProblem& problem);

// Point -> voxel quantization (sparse_quantize).
struct QuantizeProblem {
  std::string op = "sparse_quantize";
  Dtype dtype = Dtype::f32;  // point dtype
  Device device;
  std::int64_t n_points = 0;
};
std::string to_string(const QuantizeProblem& problem);

}  // namespace lattice
