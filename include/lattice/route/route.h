// Route selection: pure policy. For each op a table of routes, each with an admit(problem,
// caps) predicate returning ok or one reason, and a preference rank. select() is explain().chosen,
// so the diagnostics can never disagree with what runs. Nothing here throws, allocates device
// memory or touches tensors.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lattice/route/caps.h"
#include "lattice/route/problem.h"

namespace lattice {

enum class RouteId {
  conv_reference,            // src/backend/cpu/conv/reference.cpp
  conv_pointwise_matmul,     // src/backend/cpu/conv/pointwise_matmul.cpp
  conv_gather_gemm_scatter,  // src/backend/cpu/conv/gather_gemm_scatter.cpp
  quantize_reference,        // src/backend/cpu/quantize/reference.cpp
  point_voxel_reference,     // src/backend/cpu/point_voxel/reference.cpp
  point_voxel_parallel,      // src/backend/cpu/point_voxel/parallel.cpp
  pool_reference,            // src/backend/cpu/pool/reference.cpp
  pool_csr_reduce,           // src/backend/cpu/pool/csr_reduce.cpp
  pool_input_exclusive,      // src/backend/cpu/pool/input_exclusive.cpp
  algebra_reference,         // src/backend/cpu/algebra/reference.cpp
  algebra_hashed,            // src/backend/cpu/algebra/hashed.cpp
  coords_reference,          // src/backend/cpu/coords/reference.cpp
  // CUDA routes (src/backend/cuda/<family>/...).
  conv_cuda_gather_gemm_scatter,  // src/backend/cuda/conv/gather_gemm_scatter.cu
  conv_implicit_gemm_sm80,        // src/backend/cuda/conv/implicit_gemm_sm80.cu
  quantize_cuda,                  // src/backend/cuda/point_voxel/quantize.cu (sparse_quantize)
  point_voxel_cuda,               // src/backend/cuda/point_voxel/point_voxel.cu
  pool_cuda_csr_reduce,           // src/backend/cuda/pool/csr_reduce.cu
  algebra_cuda_hashed,            // src/backend/cuda/algebra/hashed.cu
  coords_cuda,                    // src/backend/cuda/coords/utilities.cu
  // Packed affine weights (family "quantized").
  quantized_dequant_reference,     // src/backend/cpu/quantized/dequant_reference.cpp
  quantized_fused_dequant_gemm,   // src/backend/cpu/quantized/fused_dequant_gemm.cpp
  quantized_cuda_dequant_gemm,    // src/backend/cuda/quantized/dequant_gemm.cu
};
// Public route names drop the op prefix: "reference", "pointwise_matmul", ...
std::string_view to_string(RouteId id);
std::string_view op_family(RouteId id);  // "conv", "quantize"
// Parses a public route name within an op family ("conv", "quantize").
std::optional<RouteId> route_from_string(std::string_view family, std::string_view name);

struct Verdict {
  bool admitted = true;
  std::string reason;  // why not admitted (empty when admitted)
  static Verdict ok() { return {}; }
  static Verdict no(std::string why) { return {false, std::move(why)}; }
};

struct RouteRow {
  RouteId id;
  int rank;         // lower is preferred
  Verdict verdict;
};

struct Explanation {
  std::string op;
  std::string problem;        // one-line problem summary
  std::string caps;           // one-line device capabilities summary
  std::vector<RouteRow> rows; // in rank order
  std::optional<RouteId> chosen;
  std::optional<RouteId> forced;  // the route the policy asked for, if any
  std::string forced_reason;      // why the forced route was rejected (empty if admitted)

  // Rendered table: the chosen route and every rejected route with its reason.
  std::string to_string() const;
  const RouteRow* row(RouteId id) const;
};

struct RoutePolicy {
  std::optional<RouteId> force;  // run exactly this route, or fail loudly when it is not admitted
};

Explanation explain(const ConvProblem& problem, const DeviceCaps& caps, const RoutePolicy& policy = {});
Explanation explain(const QuantizeProblem& problem, const DeviceCaps& caps,
                    const RoutePolicy& policy = {});
Explanation explain(const PointVoxelProblem& problem, const DeviceCaps& caps,
                    const RoutePolicy& policy = {});
Explanation explain(const PoolProblem& problem, const DeviceCaps& caps, const RoutePolicy& policy = {});
Explanation explain(const AlgebraProblem& problem, const DeviceCaps& caps,
                    const RoutePolicy& policy = {});
Explanation explain(const CoordsProblem& problem, const DeviceCaps& caps,
                    const RoutePolicy& policy = {});
Explanation explain(const QuantizedProblem& problem, const DeviceCaps& caps,
                    const RoutePolicy& policy = {});

template <class Problem>
std::optional<RouteId> select(const Problem& problem, const DeviceCaps& caps,
                              const RoutePolicy& policy = {}) {
  return explain(problem, caps, policy).chosen;
}

}  // namespace lattice
