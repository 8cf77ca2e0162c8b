// Relations (SEMANTICS.md "Relations"): who sends to whom, as a map plus the views the kernels
// need, built on demand. All arrays live on the device of the input coordinates (built there,
// bitwise equal to the CPU build). Edge indices are int32 (rows < 2^31); pointers into edge lists are int64.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include "lattice/core/array.h"
#include "lattice/core/vocab.h"
#include "lattice/route/problem.h"

namespace lattice {

class CoordinateSet;

// Views. A relation stores what its builder produces, the (n_out, K) gemm map (and, for a
// transpose, its forward's maps); every other view is derived from the map on first use, once
// (std::call_once), by the relation route on the relation's device, deterministically and bitwise
// equal on CPU and CUDA. A conv route reads only the views its pass needs
// (conv_relation_reads, lattice/route/problem.h), so a forward with implicit GEMM on CUDA builds
// no edge list, no grouping and never counts the edges (no read-back).
class Relation {
 public:
  RelationKind kind = RelationKind::submanifold;
  KernelSpec spec;
  std::int64_t n_in = 0;
  std::int64_t n_out = 0;
  std::int64_t kernel_volume = 1;
  bool identity = false;  // edges are exactly (i, i, 0) for every row
  // Built as the transpose of a cached forward / target relation between the same two coordinate
  // sets (transpose_relation: its forward's maps swapped, nothing hashed); explain() says so.
  bool transposed = false;

  // The edge count: known from the geometry (relation.cpp edge_hints), from the relation this
  // one transposes, or counted on first use (one device read-back on CUDA).
  std::int64_t n_edges() const;
  // The count when known without counting, else -1.
  std::int64_t known_edges() const { return n_edges_.load(std::memory_order_acquire); }
  // The count when known, or when the copy a device build queued (see pending_edges_) has landed;
  // else -1. Never waits: what a view that reads the count back itself when it must starts from.
  std::int64_t landed_edges() const;

  // Output-major edge list sorted by (out, k): int32 (E) each. Built on first use (together).
  const Array& in_idx() const { return edge_list().in_idx; }
  const Array& out_idx() const { return edge_list().out_idx; }
  const Array& k_idx() const { return edge_list().k_idx; }
  // CSR over it: int64 (n_out + 1). Built on first use (no count needed).
  const Array& out_ptr() const;
  // Per-offset grouping sorted by (k, out): int64 (K + 1) and int32 (E) each. Built on first use.
  const Array& k_ptr() const { return offset_grouping().k_ptr; }
  const Array& k_in() const { return offset_grouping().k_in; }
  const Array& k_out() const { return offset_grouping().k_out; }

  // The N_out x K implicit-GEMM map: int32 (n_out, K), input row or -1. Stored by the build.
  const Array& gemm_map() const { return gemm_map_; }
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
  // the input-gradient pass of implicit GEMM reads). Built on first use on the relation's device
  // (from gemm_map alone); a transposed relation and the relation it transposes share their two maps.
  const Array& input_gemm_map() const;
  // The order implicit-GEMM tiles take the rows of gemm_map() / input_gemm_map() in: int32 (n_out)
  // / (n_in), the rows stably sorted by their offset mask, so that a tile's rows share offsets and
  // the tile visits few of them. Undefined for kernel volumes above 64 and for the identity
  // relation (every row has its one offset: index order is the mask order). Built on first use on the
  // relation's device; a function of the map alone (the same on every device and run).
  // A submanifold relation's input side mirrors its output side (mirrors_itself()): its
  // input_gemm_map() is gemm_map() with the offsets reversed, and input_gemm_order() is
  // gemm_order() itself (the same array: rows of one output mask share one input mask).
  const Array& gemm_order() const;
  const Array& input_gemm_order() const;
  bool mirrors_itself() const;
  // k_ptr on the host (K + 1 values), read back once on first use (a copy for CPU relations):
  // routes that loop over offsets on the host read this instead of synchronising every call.
  const std::vector<std::int64_t>& host_k_ptr() const;

  // Counts the edges (see n_edges()).
  double average_active_offsets() const {
    return n_out ? static_cast<double>(n_edges()) / static_cast<double>(n_out) : 0.0;
  }

  // Which views exist now (RelationView bits, lattice/core/vocab.h), and the bytes they hold on the relation's device
  // (every view above, the stored map included; host_k_ptr is host memory and not counted).
  unsigned built_views() const;
  std::int64_t view_bytes() const;
  Device device() const { return gemm_map_.device(); }

 private:
  struct EdgeList {
    Array in_idx, out_idx, k_idx;
  };
  struct OffsetGrouping {
    Array k_ptr, k_in, k_out;
  };
  const EdgeList& edge_list() const;
  const OffsetGrouping& offset_grouping() const;
  void mark(RelationView v) const { built_.fetch_or(v, std::memory_order_acq_rel); }

  friend struct RelationBuilder;  // relation.cpp: stores the map and what the build knows
  mutable std::once_flag count_once_, edge_list_once_, out_ptr_once_, grouping_once_, masks_once_, input_once_,
      host_k_ptr_once_, input_map_once_, order_once_, input_order_once_;
  mutable std::atomic<std::int64_t> n_edges_{-1};
  // The count a device build queued to the host (backend/args.h PendingCount), set by the build
  // and taken by n_edges() (cleared then); called only under pending_mutex_. has_pending_: whether
  // the build left one (a lock-free test).
  mutable std::function<std::int64_t(bool)> pending_edges_;
  mutable std::mutex pending_mutex_;
  std::atomic<bool> has_pending_{false};
  mutable std::atomic<unsigned> built_{0};
  Array gemm_map_;
  mutable EdgeList edge_list_;
  mutable Array out_ptr_;
  mutable OffsetGrouping grouping_;
  mutable Array input_gemm_map_, gemm_order_, input_gemm_order_;
  mutable std::vector<std::int64_t> host_k_ptr_;
  mutable std::atomic<bool> host_k_ptr_ready_{false};
  mutable Array row_masks_;
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
