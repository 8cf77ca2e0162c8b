// Typed, non-owning views handed from the semantic layer to kernels. Pointers refer to memory
// on the problem's device; every array is contiguous row-major.
#pragma once

#include <cstdint>

#include "lattice/core/array.h"
#include "lattice/core/dtype.h"
#include "lattice/core/vocab.h"

namespace lattice::backend {

// The views of one relation that kernels read (built by src/tensor/relation.cpp).
// Edges (i, o, k) with i < n_in, o < n_out, k < kernel_volume; at most one edge per (o, k).
struct RelationView {
  std::int64_t n_in = 0;
  std::int64_t n_out = 0;
  std::int64_t kernel_volume = 1;
  std::int64_t n_edges = 0;
  // Output-major edge list, sorted by (o, k): in_idx[e], out_idx[e], k_idx[e] (int32, E).
  const std::int32_t* in_idx = nullptr;
  const std::int32_t* out_idx = nullptr;
  const std::int32_t* k_idx = nullptr;
  // CSR over the output-major list: edges of output o are [out_ptr[o], out_ptr[o+1]) (int64, n_out+1).
  const std::int64_t* out_ptr = nullptr;
  // Per-offset grouping, sorted by (k, o): edges of offset k are [k_ptr[k], k_ptr[k+1])
  // (int64, K+1), with their input and output rows in k_in / k_out (int32, E).
  const std::int64_t* k_ptr = nullptr;
  const std::int32_t* k_in = nullptr;
  const std::int32_t* k_out = nullptr;
  bool identity = false;  // edges are exactly (i, i, 0) for every row
  // Input-side views, filled for the input-gradient pass only (null otherwise): edges per input
  // row as a CSR pointer (int64, n_in+1), and the per-offset grouping (same k_ptr) with each
  // offset's edges sorted by input row (kt_in / kt_out, int32 E).
  const std::int64_t* in_ptr = nullptr;
  const std::int32_t* kt_in = nullptr;
  const std::int32_t* kt_out = nullptr;
};

// One convolution pass. Weight is always the canonical (K, C_in, C_out) layout, same dtype as
// the features. Outputs are fully overwritten by the kernel (no need to pre-zero).
struct ConvArgs {
  Dtype dtype = Dtype::f32;
  RelationView rel;
  std::int64_t c_in = 0;
  std::int64_t c_out = 0;
  const void* x = nullptr;     // (n_in, C_in)        forward, weight_grad
  const void* w = nullptr;     // (K, C_in, C_out)    forward, input_grad
  const void* bias = nullptr;  // (C_out) or null     forward
  void* y = nullptr;           // (n_out, C_out)      forward output
  const void* dy = nullptr;    // (n_out, C_out)      input_grad, weight_grad
  void* dx = nullptr;          // (n_in, C_in)        input_grad output
  void* dw = nullptr;          // (K, C_in, C_out)    weight_grad output
};

// Point quantization: coords = floor((p - origin) / voxel) with the batch id, unique rows in
// first-occurrence order.
struct QuantizeArgs {
  Dtype dtype = Dtype::f32;     // point dtype (f32 or f64)
  std::int64_t n_points = 0;
  const void* points = nullptr;         // (P, 3)
  const std::int32_t* batch = nullptr;  // (P) or null (all batch 0)
  double voxel_size[3] = {1, 1, 1};
  double origin[3] = {0, 0, 0};
};

// What a quantize route returns (outputs are sized by the data, so the route allocates them).
struct QuantizeResult {
  Array coords;                      // (M, 4) int32, unique, first-occurrence order
  Array inverse;                     // (P) int64, point -> voxel row
  Array counts;                      // (M) int64, points per voxel
  std::int64_t first_invalid = -1;   // first point with NaN/inf (nothing else filled when >= 0)
  std::int64_t first_overflow = -1;  // first point whose voxel index leaves int32
};
}  // namespace lattice::backend
