// Relations (SEMANTICS.md "Relations"): who sends to whom, as an edge list plus the views the
// kernels need. All arrays live on the device of the input coordinates (built there, bitwise
// equal to the CPU build). Edge indices are int32 (rows < 2^31); pointers into edge lists are int64.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include "lattice/core/array.h"
#include "lattice/core/vocab.h"
#include "lattice/route/problem.h"

namespace lattice {

class CoordinateSet;

class Relation {
 public:
  RelationKind kind = RelationKind::submanifold;
  KernelSpec spec;
  std::int64_t n_in = 0;
  std::int64_t n_out = 0;
  std::int64_t kernel_volume = 1;
  std::int64_t n_edges = 0;
  bool identity = false;  // edges are exactly (i, i, 0) for every row
  // Built as the transpose of a cached forward / target relation between the same two coordinate
  // sets (transpose_relation: its edges transposed, nothing hashed); explain() says so.
  bool transposed = false;

  // Output-major edge list sorted by (out, k): int32 (E) each.
  Array in_idx, out_idx, k_idx;
  // CSR over it: int64 (n_out + 1).
  Array out_ptr;
  // Per-offset grouping sorted by (k, out): int64 (K + 1) and int32 (E) each.
  Array k_ptr, k_in, k_out;

  // The N_out x K implicit-GEMM map: int32 (n_out, K), input row or -1. Built on first use.
  const Array& gemm_map() const;
  // Row masks: int64 words holding uint64 bit patterns, (n_out, ceil(K / 64)); bit k of row o is
  // set iff offset k has an edge.
  // Built on first use.
  const Array& row_masks() const;

  // Input-side views for passes that write input rows (input gradient), built on first use:
  // in_ptr int64 (n_in + 1) = edges per input row as a CSR pointer; kt_in / kt_out int32 (E) =
  // the per-offset grouping (same k_ptr) with each offset's edges sorted by input row.
  struct InputGrouping {
    Array in_ptr, kt_in, kt_out;
  };
  const InputGrouping& input_grouping() const;
  // The input-side (n_in, K) map: output row reached from input i through offset k, or -1 (what
  // the input-gradient pass of implicit GEMM reads). Built on first use on the relation's device;
  // a transposed relation and the relation it transposes share their two maps.
  const Array& input_gemm_map() const;
  // The order implicit-GEMM tiles take the rows of gemm_map() / input_gemm_map() in: int32 (n_out)
  // / (n_in), the rows stably sorted by their offset mask, so that a tile's rows share offsets and
  // the tile visits few of them. Undefined for kernel volumes above 64 and for the identity
  // relation (every row has its one offset: index order is the mask order). Built on first use on the
  // relation's device; a function of the map alone (the same on every device and run).
  const Array& gemm_order() const;
  const Array& input_gemm_order() const;
  // k_ptr on the host (K + 1 values), read back once on first use (a copy for CPU relations):
  // routes that loop over offsets on the host read this instead of synchronising every call.
  const std::vector<std::int64_t>& host_k_ptr() const;

  double average_active_offsets() const {
    return n_out ? static_cast<double>(n_edges) / static_cast<double>(n_out) : 0.0;
  }

 private:
  friend struct RelationBuilder;  // relation.cpp: stores the gemm map it computes while building
  mutable std::once_flag gemm_once_, masks_once_, input_once_, host_k_ptr_once_, input_map_once_,
      order_once_, input_order_once_;
  mutable Array input_gemm_map_, gemm_order_, input_gemm_order_;
  mutable std::vector<std::int64_t> host_k_ptr_;
  mutable std::atomic<bool> host_k_ptr_ready_{false};
  mutable Array gemm_map_, row_masks_;
  mutable InputGrouping input_grouping_;
};

// Builds the output support (when generated) and the relation. `target` must be given for
// RelationKind::target / transposed_target. `op` names the caller in errors (e.g. an output
// coordinate that leaves the int32 range). Returned output is null when it equals `input`
// (submanifold; forward with stride 1 and no expand) or `target`.
struct BuiltRelation {
  std::shared_ptr<Relation> relation;
  std::shared_ptr<CoordinateSet> generated;
};
BuiltRelation build_relation(const CoordinateSet& input, RelationKind kind, const KernelSpec& spec,
                             const CoordinateSet* target, std::string_view op);

// The relation route's problem (family "relation", src/route/relation_routes.cpp) of building a
// `kind` relation over `input`, or of the views of a built relation; build_relation runs the
// route explain() chooses for it, and explain_conv lists that decision before the conv route's.
// Whether a `transposed_target` relation with `spec` is the transpose of the forward / target
// relation with the same spec from its target onto its input: true when no axis has a centered
// offset that differs from its indexed one (every kernel size even or 1; SEMANTICS.md "Kernel
// geometry"): then both rules read `fine == coarse*s + off_k - p` with the same offset index k.
bool transposes_forward(const KernelSpec& spec);
// The transpose of `forward` (a forward or target relation) as a relation of `kind` (built by the
// relation route's transpose kernel, on forward's device; bitwise equal to hashing it).
std::shared_ptr<Relation> transpose_relation(const Relation& forward, RelationKind kind, std::string_view op);

RelationProblem relation_problem(const CoordinateSet& input, RelationKind kind, std::int64_t kernel_volume,
                                 std::string_view op);
RelationProblem relation_problem(const Relation& relation, std::string_view op);

}  // namespace lattice
