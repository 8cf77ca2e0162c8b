// Sparse convolution (SEMANTICS.md "Convolution"):
//   Y[o, :] = sum over edges (i, o, k) of X[i, :] @ W[k]  (+ bias)
// for the submanifold, forward, target, transposed (generated or onto a target) and generative
// relations, with forward, input-gradient and weight-gradient passes.
//
// Weights: (C_out, Kx, Ky, Kz, C_in) [dense] or (K, C_in, C_out) [kernel-major]; gradients come
// back in the layout that was passed. Features and weight share one float dtype; f16/bf16 are
// accumulated in f32 and rounded once.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "lattice/core/array.h"
#include "lattice/core/vocab.h"
#include "lattice/route/route.h"
#include "lattice/tensor/relation.h"
#include "lattice/tensor/sparse_tensor.h"

namespace lattice::ops {

struct ConvOptions {
  Int3 kernel_size{3, 3, 3};
  Int3 stride{1, 1, 1};
  Int3 padding{0, 0, 0};
  Int3 dilation{1, 1, 1};
  bool expand = false;         // forward conv3d only: spconv-style output growth
  bool deterministic = true;   // require bitwise-reproducible routes
  bool allow_tf32 = false;     // fp32 may use tf32 tensor cores
  RoutePolicy policy;          // force a route (fails loudly when it is not admitted)
};

// A validated convolution geometry with its relation and output support. Cheap to copy; the
// relation is shared with the input's cache.
struct ConvPlan {
  std::string op;
  RelationKind kind = RelationKind::submanifold;
  KernelSpec spec;
  ConvOptions options;
  std::shared_ptr<const Relation> relation;
  std::shared_ptr<CoordinateSet> input;
  std::shared_ptr<CoordinateSet> output;
};

// Validates geometry, builds or fetches the relation. `target` (may be null) selects the target
// kinds. `op` is the public op name used in errors and explain().
ConvPlan plan_conv(std::string_view op, RelationKind kind, const SparseTensor& x,
                   const ConvOptions& options, const SparseTensor* target = nullptr);
// Same on coordinate sets (what the Python front end uses; `target` may be null).
ConvPlan plan_conv(std::string_view op, RelationKind kind, const std::shared_ptr<CoordinateSet>& x,
                   const ConvOptions& options, const std::shared_ptr<CoordinateSet>& target);

// Forward pass: (n_out, C_out) in the feature dtype. `bias` may be null.
Array conv_forward(const ConvPlan& plan, const Array& feats, const Array& weight,
                   const Array* bias = nullptr);

// The weight the kernels of a planned conv read: kernel-major (K, C_in, C_out), contiguous, in the
// dtype of `feats`, made in one pass on the weight's device from `weight` in either layout and any
// float dtype (the array itself when it is already so). What a training call passes to
// conv_forward and saves for conv_backward when its parameter is a dense float32 master weight
// under torch.autocast: one permuting cast per call instead of a cast, a permutation in the
// forward and another in the backward. Same shape errors as conv_forward; TypeError for a weight
// dtype contiguous_as cannot convert from.
Array conv_compute_weight(const ConvPlan& plan, const Array& feats, const Array& weight);

// The form of conv_backward's weight gradient when it is not that of the weight passed in: the
// layout and float dtype of the caller's parameter (e.g. the dense float32 master weight whose
// conv_compute_weight was passed). The gradient is computed in the feature dtype as always and
// converted once (exact widening: the same values as converting afterwards).
struct WeightGradForm {
  WeightLayout layout = WeightLayout::kernel_major;
  Dtype dtype = Dtype::f32;
};

struct ConvGradRequest {
  bool input = true;
  bool weight = true;
  bool bias = false;
  std::optional<WeightGradForm> weight_as;  // unset: the layout and dtype of the weight passed in
};
struct ConvGrads {
  Array input;   // (n_in, C_in), undefined when not requested
  Array weight;  // the layout of `weight`, undefined when not requested
  Array bias;    // (C_out), undefined when not requested
};
ConvGrads conv_backward(const ConvPlan& plan, const Array& feats, const Array& weight,
                        const Array& grad_out, ConvGradRequest request = {});

// Tuning runs (lattice/route/tuning.h; lattice.tune in Python). While enabled, the first conv
// pass (forward, input gradient, weight gradient) of every tuning bucket without a recorded choice
// times each admitted route except the reference route on the call's own data: one warm-up run,
// then `reps` timed runs (wall clock; on a device each run waits for its output, so the time
// includes the launches), the median kept. A candidate that throws is recorded as failed and never
// chosen; the tuning carries on with the others. The fastest is recorded (a tie keeps the better
// rank) and the call then runs it, as every later call of that bucket does. A forced route
// (policy or LATTICE_FORCE_ROUTE) disables tuning for its calls. Timing reads back from the device,
// so do not tune inside CUDA graph capture. Process-wide; off by default.
void set_conv_tuning(bool enabled, int reps = 5);
bool conv_tuning_enabled();

// The route decision for one pass of a planned convolution.
Explanation explain_conv(const ConvPlan& plan, const Array& feats, const Array& weight,
                         ConvPass pass = ConvPass::forward);

// One-call conveniences (plan + forward). `target` selects conv3d-onto-target /
// transposed-onto-target.
SparseTensor conv3d(const SparseTensor& x, const Array& weight, const ConvOptions& options,
                    const Array* bias = nullptr, const SparseTensor* target = nullptr);
SparseTensor subm_conv3d(const SparseTensor& x, const Array& weight, const ConvOptions& options,
                         const Array* bias = nullptr);
SparseTensor conv_transpose3d(const SparseTensor& x, const Array& weight,
                              const ConvOptions& options, const Array* bias = nullptr,
                              const SparseTensor* target = nullptr);
SparseTensor generative_conv_transpose3d(const SparseTensor& x, const Array& weight,
                                         const ConvOptions& options, const Array* bias = nullptr);

// Weight layout converters (never applied implicitly).
Array weight_dense_to_kernel_major(const Array& weight);                      // -> (K, C_in, C_out)
Array weight_kernel_major_to_dense(const Array& weight, Int3 kernel_size);    // -> (C_out, Kx, Ky, Kz, C_in)
Array weight_spconv_to_dense(const Array& weight);  // (Kx, Ky, Kz, C_out, C_in) -> dense

}  // namespace lattice::ops
