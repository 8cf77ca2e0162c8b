// Route selection: pure policy. For each op a table of routes, each with an admit(problem,
// caps) predicate returning ok or one reason, and a preference rank. select() is explain().chosen,
// so the diagnostics can never disagree with what runs. Nothing here throws, allocates device
// memory or touches tensors.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lattice/route/caps.h"
#include "lattice/route/problem.h"

namespace lattice {

// A route's identity inside the program. Everything else about a route (its family, public name,
// device, tier, rank, kernel entry points, kernel file and constraints) is in its row
// (RouteInfo) in src/route/<family>_routes.cpp; nothing else spells it out.
enum class RouteId {
  conv_reference,
  conv_pointwise_matmul,
  conv_gather_gemm_scatter,
  quantize_reference,
  point_voxel_reference,
  point_voxel_parallel,
  pool_reference,
  pool_csr_reduce,
  pool_input_exclusive,
  algebra_reference,
  algebra_hashed,
  coords_reference,
  conv_cuda_gather_gemm_scatter,
  conv_implicit_gemm_sm80,
  quantize_cuda,
  point_voxel_cuda,
  pool_cuda_csr_reduce,
  algebra_cuda_hashed,
  coords_cuda,
  quantized_dequant_reference,
  quantized_fused_dequant_gemm,
  quantized_cuda_dequant_gemm,
  relation_cpu_hash,
  relation_cuda_hash,
  pool_edges_reference,
  pool_edges_cuda,
  point_index_reference,
  point_index_cuda,
  dequantize_reference,
  dequantize_cuda,
  quantized_cuda_decode_conv,
  batch_norm_reference,
  batch_norm_parallel,
  batch_norm_cuda,
  conv_cuda_pointwise_matmul,
};

// The source file that implements a route and the constraints paragraph it opens with (the text
// after "// Constraints:" up to the first empty comment line; tests/python/test_route_table.py
// checks the two agree).
struct KernelFile {
  std::string_view path;
  std::string_view constraints;
};

// One row of a route table. Names, parsing, the bindings' error lists, the route lists the tests
// iterate over and the route table in docs/architecture.md all come from these rows.
struct RouteInfo {
  RouteId id;
  std::string_view family;       // op family: "conv", "pool", ...
  std::string_view name;         // public name, unique within the family
  std::string_view device;       // where it runs: "cpu", "cuda" or "cpu, cuda"
  GpuTier tier;                  // lowest GPU tier it needs (none for CPU-only routes)
  int rank;                      // lower is preferred
  std::string_view kernels;      // backend entry points it runs (space separated)
  std::array<KernelFile, 2> files;  // its kernel file(s); an unused entry has an empty path
};

// Every row of every family: families in table order, rows by rank (stable) within a family.
const std::vector<RouteInfo>& route_table();
const RouteInfo& route_info(RouteId id);
// The op families, in table order ("conv", "quantize", ...).
std::vector<std::string_view> route_families();
// A family's public route names in rank order (empty for an unknown family).
std::vector<std::string_view> route_names(std::string_view family);
// "'a'", "'a' or 'b'", "one of 'a', 'b', 'c'": the "expected ..." of an unknown route name.
std::string route_name_list(std::string_view family);

// Public route names drop the op prefix: "reference", "pointwise_matmul", ...
std::string_view to_string(RouteId id);
std::string_view op_family(RouteId id);
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
  // The further route decisions the call makes after this one, in order (the float conv route that
  // quantized dequant_reference runs on the decoded weight, ...); rendered after this table.
  std::vector<Explanation> stages;
  // The route decisions this one depends on, made before it (the relation route that builds, or
  // built, the relation a convolution reads); rendered before this table.
  std::vector<Explanation> prior;
  // A measured choice (lattice/route/tuning.h) that decided this call, or that exists but could
  // not (its route is not admitted now): the bucket, each candidate's time and the outcome.
  // Empty when no tuning run covered this problem.
  std::string tuned;
  bool tuned_chosen = false;  // the chosen route is the measured one (not the rank order's)

  // Rendered table: the chosen route and every rejected route with its reason.
  std::string to_string() const;
  const RouteRow* row(RouteId id) const;
};

struct RoutePolicy {
  std::optional<RouteId> force;  // run exactly this route, or fail loudly when it is not admitted
  // Families with measured choices (conv): a recorded choice for the problem's bucket decides
  // while it stays admitted (lattice/route/tuning.h); false decides by rank alone. A forced
  // route always wins.
  bool use_tuned = true;
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
Explanation explain(const RelationProblem& problem, const DeviceCaps& caps,
                    const RoutePolicy& policy = {});
Explanation explain(const PoolEdgesProblem& problem, const DeviceCaps& caps,
                    const RoutePolicy& policy = {});
Explanation explain(const PointIndexProblem& problem, const DeviceCaps& caps,
                    const RoutePolicy& policy = {});
Explanation explain(const DequantizeProblem& problem, const DeviceCaps& caps,
                    const RoutePolicy& policy = {});
Explanation explain(const BatchNormProblem& problem, const DeviceCaps& caps,
                    const RoutePolicy& policy = {});

// The route explain() would choose, without rendering anything (the hot path of every op). Same
// rows, same order, same policy handling as explain(); tests assert select() == explain().chosen.
std::optional<RouteId> select(const ConvProblem& problem, const DeviceCaps& caps, const RoutePolicy& policy = {});
std::optional<RouteId> select(const QuantizeProblem& problem, const DeviceCaps& caps, const RoutePolicy& policy = {});
std::optional<RouteId> select(const PointVoxelProblem& problem, const DeviceCaps& caps, const RoutePolicy& policy = {});
std::optional<RouteId> select(const PoolProblem& problem, const DeviceCaps& caps, const RoutePolicy& policy = {});
std::optional<RouteId> select(const AlgebraProblem& problem, const DeviceCaps& caps, const RoutePolicy& policy = {});
std::optional<RouteId> select(const CoordsProblem& problem, const DeviceCaps& caps, const RoutePolicy& policy = {});
std::optional<RouteId> select(const QuantizedProblem& problem, const DeviceCaps& caps, const RoutePolicy& policy = {});
std::optional<RouteId> select(const RelationProblem& problem, const DeviceCaps& caps, const RoutePolicy& policy = {});
std::optional<RouteId> select(const PoolEdgesProblem& problem, const DeviceCaps& caps, const RoutePolicy& policy = {});
std::optional<RouteId> select(const PointIndexProblem& problem, const DeviceCaps& caps, const RoutePolicy& policy = {});
std::optional<RouteId> select(const DequantizeProblem& problem, const DeviceCaps& caps, const RoutePolicy& policy = {});
std::optional<RouteId> select(const BatchNormProblem& problem, const DeviceCaps& caps, const RoutePolicy& policy = {});

// The relation views conv route `route` reads in `pass` (RelationView bits, lattice/core/vocab.h), declared beside its
// row in src/route/conv_routes.cpp and matching its kernel file; kViewAll for a route of
// another family.
unsigned conv_relation_reads(RouteId route, ConvPass pass);

}  // namespace lattice
