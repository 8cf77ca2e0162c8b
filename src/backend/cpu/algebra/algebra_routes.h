// CPU sparse-algebra routes: alignment of two coordinate sets by value, lookups of query rows and
// the elementwise combine of aligned feature rows, one file per route, called through the
// kernel table.
//
// Contract shared by both routes (AlignArgs, LookupArgs, CombineArgs in backend/args.h): CPU
// memory, contiguous row-major; coordinate rows (batch, x, y, z) int32, unique within a set
// (the semantic layer checks); row maps int64 with -1 for "absent, use the fill". Features of one
// float dtype (f16, bf16, f32, f64); f16/bf16 computed in f32 and rounded once per element.
// Every output is fully overwritten. Admission is decided in src/route/algebra_routes.cpp; each
// route's file opens with a `Constraints:` comment stating the same conditions.
#pragma once

#include "backend/args.h"

namespace lattice::backend::cpu {

// reference.cpp: single-threaded scalar loops; sets are matched through a sorted copy of the row
// order and binary search (independent of the coordinate index), the oracle for the others.
AlignResult algebra_reference_align(const AlignArgs& args);
void algebra_reference_lookup(const LookupArgs& args);
void algebra_reference_forward(const CombineArgs& args);
void algebra_reference_backward(const CombineArgs& args);

// hashed.cpp: probes the coordinate index the tensor layer built (CoordFinder) from lattice's
// OpenMP threads; compaction by fixed-size blocks and a prefix sum (deterministic, the same for
// any thread count); parallel row loops for the combine passes.
AlignResult algebra_hashed_align(const AlignArgs& args);
void algebra_hashed_lookup(const LookupArgs& args);
void algebra_hashed_forward(const CombineArgs& args);
void algebra_hashed_backward(const CombineArgs& args);

}  // namespace lattice::backend::cpu
