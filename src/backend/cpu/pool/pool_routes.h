// What the CPU pooling routes share (and the CUDA route follows): their contract, summation
// orders and the max rule. Each route's file defines its entry points and registers them
// (LATTICE_ROUTE_KERNELS); they are called through the kernel table and declared nowhere else.
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

}  // namespace lattice::backend::cpu
