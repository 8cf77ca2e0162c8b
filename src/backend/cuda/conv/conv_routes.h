// CUDA convolution routes: one function per (route, pass), called through the kernel table.
//
// Contract (ConvArgs in backend/args.h): every array on args.device (a CUDA device), contiguous
// row-major, features and weight of one dtype (f16, bf16, f32), weight in the canonical
// (K, C_in, C_out) layout; work is enqueued on the current stream of args.device and the
// functions return without waiting for it. Each pass fully overwrites its output (y, dx, dw,
// dbias). Products are accumulated in f32 (tf32 tensor cores for f32 only with
// args.allow_tf32) and every output element is rounded to the storage dtype once, at the end.
// Deterministic: no float atomics; repeated runs on one device give bitwise-identical results.
// Admission is decided in src/route/conv_routes.cpp; each route file opens with a matching
// `Constraints:` comment.
#pragma once

#include "backend/args.h"

namespace lattice::backend::cuda {

// gather_gemm_scatter.cu: per kernel offset, gather rows, one cuBLAS GEMM, scatter-add.
void conv_cuda_gather_gemm_scatter_forward(const ConvArgs& args);
void conv_cuda_gather_gemm_scatter_input_grad(const ConvArgs& args);
void conv_cuda_gather_gemm_scatter_weight_grad(const ConvArgs& args);

// implicit_gemm_sm80.cu: tensor-core implicit GEMM through the N_out x K map (sm_80+).
void conv_implicit_gemm_sm80_forward(const ConvArgs& args);
void conv_implicit_gemm_sm80_input_grad(const ConvArgs& args);
void conv_implicit_gemm_sm80_weight_grad(const ConvArgs& args);

// common/conv_support.cu: dbias (C_out) = column sums of dy (n_out, C_out), both routes.
void conv_cuda_bias_grad(const ConvArgs& args);

}  // namespace lattice::backend::cuda
