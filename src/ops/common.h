// Helpers shared by the semantic-layer op files.
#pragma once

#include <memory>
#include <string_view>

#include "backend/args.h"
#include "lattice/core/vocab.h"
#include "lattice/route/route.h"
#include "lattice/tensor/coordinate_set.h"
#include "lattice/tensor/relation.h"

namespace lattice::ops {

// The caller's policy, or the one named by the environment variable LATTICE_FORCE_ROUTE
// ("<family>:<route>" or "<route>", e.g. "conv:reference"; for benchmarks) when the caller forced
// nothing. An unknown name in the variable raises ValueError.
RoutePolicy effective_policy(const RoutePolicy& policy, std::string_view family);

// The chosen route, or: ValueError "[op] route: expected an admitted route, got 'x' (rejected:
// reason)" for a rejected forced route; UnsupportedError with the explain table when no route
// is admitted.
RouteId chosen_or_throw(const Explanation& explanation);

// select() on the hot path (nothing rendered); only when no route is admitted is the explanation
// built, for chosen_or_throw's error. Same answer as chosen_or_throw(explain(...)).
template <class Problem>
RouteId decide_or_throw(const Problem& problem, const DeviceCaps& caps, const RoutePolicy& policy) {
  if (const std::optional<RouteId> id = select(problem, caps, policy)) return *id;
  return chosen_or_throw(explain(problem, caps, policy));
}

struct ConvPlan;
// The conv table's decision for `plan` over float `feats` and a weight of `c_out` columns (what
// conv_forward / conv_backward choose); quantized dequant_reference reports it as its next stage.
Explanation explain_float_conv(const ConvPlan& plan, const Array& feats, std::int64_t c_out, ConvPass pass);
// The relation route that builds (or built) the plan's relation (family "relation"): the decision
// explain_conv lists before the conv route's.
Explanation explain_relation(const ConvPlan& plan);

// ---- relation planning shared by the ops that run over relations (conv, pool) ------------------

// Kernel geometry of a call, as the caller gave it (`requested.expand` included): sizes >= 1,
// strides >= 1, paddings >= 0, dilations >= 1, a kernel volume <= 2^20; expand only for a
// forward relation; submanifold: odd sizes and stride 1; generative: no padding. ValueError
// "[op] <argument>: expected ..., got ..." otherwise.
void check_geometry(std::string_view op, const KernelSpec& requested, RelationKind kind);

// Output tensor stride: input * stride (forward kinds; must stay within int32), input / stride
// (transposed kinds; exact division required). ValueError naming `stride` otherwise.
Int3 output_stride(std::string_view op, RelationKind kind, Int3 input_stride, Int3 stride);

// A validated relation of one call: the spec it was built with (submanifold: stride 1 and no
// padding; generative: no padding), the relation (built or fetched from x's cache) and its
// output support (x, the target or a generated set, at the output stride).
struct PlannedRelation {
  KernelSpec spec;
  std::shared_ptr<const Relation> relation;
  std::shared_ptr<CoordinateSet> output;
};
// check_geometry, then: a target for the target kinds ("[op] coordinates: ..."), CPU
// coordinates (UnsupportedError otherwise), a target on x's device and at the output stride.
PlannedRelation plan_relation(std::string_view op, RelationKind kind,
                              const std::shared_ptr<CoordinateSet>& x, const KernelSpec& requested,
                              const std::shared_ptr<CoordinateSet>& target);

// The kernels' view of a relation (non-owning pointers into its arrays): the views of `r` named by `reads` (RelationView bits, lattice/core/vocab.h; conv_relation_reads(route, pass) for a
// conv route), built on first use; every other field of the view stays null / 0.
backend::RelationView relation_view(const Relation& r, unsigned reads);

}  // namespace lattice::ops
