// Batch normalisation over the rows of an (N, C) feature matrix, with an optional fused ReLU
// (family "batch_norm"): the semantics of torch.nn.BatchNorm1d (then ReLU).
//
// Training: the rows' mean and biased variance normalise; running_mean / running_var (when given)
// are updated in place to (1 - momentum) * running + momentum * batch with the unbiased variance
// N / (N - 1); N = 1 raises ValueError ("expected more than 1 row per channel when training");
// N = 0 returns an empty output and leaves the running statistics alone (torch does the same).
// Eval: the running statistics normalise (both required). f16 / bf16 features compute in f32 and
// round the output once; every per-channel array (weight, bias, running statistics, the saved
// mean / invstd, the parameter gradients) is f32 (f64 for f64 features). Deterministic: the sums
// over rows run in a fixed order for every thread count and grid (backend/common/batch_norm.h).
#pragma once

#include <string>

#include "lattice/core/array.h"
#include "lattice/route/route.h"

namespace lattice::ops {

struct BatchNormOptions {
  std::string op = "batch_norm";  // names the caller in errors ("BatchNorm" for the nn module)
  bool training = true;
  bool relu = false;   // max(y, 0) on the output (the backward masks dy by y > 0)
  double eps = 1e-5;   // > 0
  double momentum = 0.1;  // in [0, 1]
  RoutePolicy policy;  // force a route (fails loudly when it is not admitted)
};

struct BatchNormOutput {
  Array y;       // (N, C), the features' dtype
  Array mean;    // (C) the statistics the output was normalised with (batch or running): what
  Array invstd;  // (C)   backward reads, with x (and y when relu)
};

// weight / bias / running_mean / running_var may be undefined (Array{}): weight 1, bias 0, no
// running statistics (training only). The running statistics are written in place (training).
// residual (optional, (N, C) of x's dtype and device): y = relu(bn(x) + residual), the sum in the
// accumulation type and rounded once (the residual block's `relu(bn(conv(x)) + skip)` as one pass).
BatchNormOutput batch_norm_forward(const Array& x, const Array& weight, const Array& bias, const Array& running_mean,
                                   const Array& running_var, const BatchNormOptions& options,
                                   const Array& residual = Array{});

struct BatchNormGrads {
  Array dx;       // (N, C), undefined unless need_input
  Array dweight;  // (C), undefined unless need_params
  Array dbias;    // (C), undefined unless need_params
  Array dresidual;  // (N, C), undefined unless need_residual: dy where y > 0 (relu), dy itself without
};

// The gradients of batch_norm_forward's output: x, weight (or undefined), the forward's mean /
// invstd, its output y (required when options.relu), dy (N, C) of x's dtype.
// need_residual: the gradient of the forward's residual input (dy masked by y > 0 with the ReLU; dy
// itself, the same array, without).
BatchNormGrads batch_norm_backward(const Array& dy, const Array& x, const Array& y, const Array& weight,
                                   const Array& mean, const Array& invstd, bool need_input, bool need_params,
                                   const BatchNormOptions& options, bool need_residual = false);

// The route decision of one pass without running it.
Explanation explain_batch_norm(const Array& x, BatchNormPass pass, const BatchNormOptions& options);

}  // namespace lattice::ops
