// What the CPU convolution routes share: their contract and the bias gradient they all use. Each
// route's file defines its entry points and registers them (LATTICE_ROUTE_KERNELS); they are
// called through the kernel table and declared nowhere else.
//
// Contract shared by all of them (ConvArgs in backend/args.h): CPU memory, contiguous row-major,
// features and weight of one float dtype (f16, bf16, f32, f64), weight in the canonical
// (K, C_in, C_out) layout. Each function fully overwrites its output (y, dx or dw); the inputs
// it reads are listed per pass in args.h. f16/bf16 accumulate in f32 and f64 in f64; every
// output element is rounded to the storage dtype exactly once, at the end.
// Admission (which problems a route accepts) is decided in src/route; each route's file opens
// with a `Constraints:` comment stating the same conditions.
#pragma once

#include "backend/args.h"

namespace lattice::backend::cpu {

// reference.cpp: dbias = the column sums of dy (n_out rows), in Accum<T>, rows in order; every
// CPU route's bias gradient (each route's LATTICE_ROUTE_KERNELS names it).
void conv_reference_bias_grad(const ConvArgs& args);

}  // namespace lattice::backend::cpu
