// CPU convolution routes: one function per (route, pass), called through the kernel table.
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

// reference.cpp: scalar loops over the edge lists, single-threaded; the oracle for the others.
void conv_reference_forward(const ConvArgs& args);
void conv_reference_input_grad(const ConvArgs& args);
void conv_reference_weight_grad(const ConvArgs& args);
// dbias = the column sums of dy (n_out rows), in Accum<T>, rows in order; every CPU route's
// bias gradient.
void conv_reference_bias_grad(const ConvArgs& args);

// pointwise_matmul.cpp: kernel volume 1 and the identity relation, one GEMM per pass.
void conv_pointwise_matmul_forward(const ConvArgs& args);
void conv_pointwise_matmul_input_grad(const ConvArgs& args);
void conv_pointwise_matmul_weight_grad(const ConvArgs& args);

// gather_gemm_scatter.cpp: per kernel offset, gather rows, one GEMM, scatter-add; deterministic.
void conv_gather_gemm_scatter_forward(const ConvArgs& args);
void conv_gather_gemm_scatter_input_grad(const ConvArgs& args);
void conv_gather_gemm_scatter_weight_grad(const ConvArgs& args);

}  // namespace lattice::backend::cpu
