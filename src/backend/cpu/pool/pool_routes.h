// CPU pooling routes: one function per (route, pass), called through the kernel table.
//
// Contract shared by all of them (PoolArgs in backend/args.h): CPU memory, contiguous row-major
// features of one float dtype (f16, bf16, f32, f64); an output-major edge list (out_ptr,
// in_idx) with no input row twice within one output row. Each function fully overwrites its
// outputs (y and argmax, or dx). f16/bf16 accumulate in f32 and f64 in f64; every output element
// is rounded to the storage dtype exactly once, at the end (max copies the winning element).
//
// Summation orders, identical in every route so that the routes agree bitwise:
//   forward     y[o]  = sum over the edges of o in edge-list order, then / n_o for avg,
//   input_grad  dx[i] = 0 + sum over the edges (i, o) with o ascending of the term
//               dy[o] (sum), dy[o] / n_o (avg), w_e * dy[o] (weighted), and for max, per
//               channel, dy[o] where argmax[o] == i.
// Admission (which problems a route accepts) is decided in src/route/pool_routes.cpp; each
// route's file opens with a `Constraints:` comment stating the same conditions.
#pragma once

#include <cstdint>

#include "backend/args.h"

namespace lattice::backend::cpu {

// reference.cpp: scalar loops over the edge list, single-threaded; the oracle for the others.
void pool_reference_forward(const PoolArgs& args);
void pool_reference_input_grad(const PoolArgs& args);

// csr_reduce.cpp: forward per output row, input gradient per input row over an input-major copy
// of the edge list; OpenMP over rows, deterministic.
void pool_csr_reduce_forward(const PoolArgs& args);
void pool_csr_reduce_input_grad(const PoolArgs& args);

// input_exclusive.cpp: input gradient when every input row has at most one edge: a gather.
void pool_input_exclusive_input_grad(const PoolArgs& args);

namespace pool_detail {

// The max rule (SEMANTICS.md "Pooling"): does value v of input row i beat the current best
// (value `best` of row `best_i`)? The larger value wins; equal values go to the smaller input
// row, i.e. the first edge in (input row, kernel row) order (one input row reaches an output row
// through one kernel row only). NaN beats every number (it propagates, as in torch), and among
// NaNs the smaller row wins. -0.0 and +0.0 are equal.
template <class A>
inline bool max_beats(A v, std::int32_t i, A best, std::int32_t best_i) {
  if (v > best) return true;                      // neither is NaN
  if (v == best) return i < best_i;               // neither is NaN
  if (v != v) return best == best || i < best_i;  // v is NaN: beats a number, ties among NaNs
  return false;                                   // v < best, or best is NaN and v is not
}

}  // namespace pool_detail

// edges.cpp (family pool_edges, route reference): the edge lists of global pooling and trilinear
// upsampling for CPU coordinates (TrilinearEdgesArgs::coarse_slots: the coarse set's CPU index).
PoolEdgeList pool_edges_reference_batch(const BatchEdgesArgs& args);
PoolEdgeList pool_edges_reference_trilinear(const TrilinearEdgesArgs& args);

}  // namespace lattice::backend::cpu
