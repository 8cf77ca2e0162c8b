// Constraints: CPU; kernel volume 1; identity relation (edges exactly (i, i, 0) for every row,
// so n_in == n_out); float dtypes (f16, bf16, f32, f64). Deterministic.
//
// A 1x1x1 convolution at stride 1 without padding or target is a matmul over rows
// (SEMANTICS.md "Convolution"): one BLAS GEMM per pass, no edge lists read.
//
// Shapes (named axes; N = n_in = n_out): x (N, C_in), w (1, C_in, C_out), bias (C_out) or null,
// y (N, C_out), dy (N, C_out), dx (N, C_in), dw (1, C_in, C_out); all of the storage dtype T.
//   forward     y  = x @ W[0] + bias
//   input_grad  dx = dy @ W[0]^T
//   weight_grad dw[0] = x^T @ dy
// Numerics: GEMMs in Accum<T> (sgemm for f16/bf16/f32, dgemm for f64); f16/bf16 operands are
// widened to f32 copies first and each output element is rounded to T once, at the end.
#include <cstdint>
#include <vector>

#include "backend/cpu/conv/conv_routes.h"
#include "backend/cpu/conv/gemm_support.h"
#include "lattice/core/error.h"

namespace lattice::backend::cpu {
namespace {

using detail::accum_target;
using detail::as_accum;
using detail::gemm;
using detail::store_all;

void check_pointwise(const RelationView& rel) {
  LATTICE_ASSERT(rel.kernel_volume == 1 && rel.identity && rel.n_in == rel.n_out,
                 "conv pointwise_matmul: requires kernel volume 1 and the identity relation");
}

template <class T>
void forward(const ConvArgs& a) {
  using A = Accum<T>;
  const std::int64_t n = a.rel.n_out;
  std::vector<A> acc_buf, x_buf, w_buf;
  auto* y = static_cast<T*>(a.y);
  A* acc = accum_target(y, n * a.c_out, acc_buf);
  const auto* bias = static_cast<const T*>(a.bias);
  if (bias) detail::fill_rows(acc, n, a.c_out, bias);
  const A* x = as_accum(static_cast<const T*>(a.x), n * a.c_in, x_buf);
  const A* w = as_accum(static_cast<const T*>(a.w), a.c_in * a.c_out, w_buf);
  gemm<A>(false, false, n, a.c_out, a.c_in, x, a.c_in, w, a.c_out, bias ? A{1} : A{0}, acc,
          a.c_out);
  store_all(acc, n * a.c_out, y);
}

template <class T>
void input_grad(const ConvArgs& a) {
  using A = Accum<T>;
  const std::int64_t n = a.rel.n_in;
  std::vector<A> acc_buf, dy_buf, w_buf;
  auto* dx = static_cast<T*>(a.dx);
  A* acc = accum_target(dx, n * a.c_in, acc_buf);
  const A* dy = as_accum(static_cast<const T*>(a.dy), n * a.c_out, dy_buf);
  const A* w = as_accum(static_cast<const T*>(a.w), a.c_in * a.c_out, w_buf);
  gemm<A>(false, true, n, a.c_in, a.c_out, dy, a.c_out, w, a.c_out, A{0}, acc, a.c_in);
  store_all(acc, n * a.c_in, dx);
}

template <class T>
void weight_grad(const ConvArgs& a) {
  using A = Accum<T>;
  const std::int64_t n = a.rel.n_in;
  std::vector<A> acc_buf, x_buf, dy_buf;
  auto* dw = static_cast<T*>(a.dw);
  A* acc = accum_target(dw, a.c_in * a.c_out, acc_buf);
  const A* x = as_accum(static_cast<const T*>(a.x), n * a.c_in, x_buf);
  const A* dy = as_accum(static_cast<const T*>(a.dy), n * a.c_out, dy_buf);
  gemm<A>(true, false, a.c_in, a.c_out, n, x, a.c_in, dy, a.c_out, A{0}, acc, a.c_out);
  store_all(acc, a.c_in * a.c_out, dw);
}

}  // namespace

void conv_pointwise_matmul_forward(const ConvArgs& args) {
  check_pointwise(args.rel);
  dispatch_float(args.dtype, "conv_pointwise_matmul_forward", "dtype",
                 [&](auto tag) { forward<typename decltype(tag)::type>(args); });
}

void conv_pointwise_matmul_input_grad(const ConvArgs& args) {
  check_pointwise(args.rel);
  dispatch_float(args.dtype, "conv_pointwise_matmul_input_grad", "dtype",
                 [&](auto tag) { input_grad<typename decltype(tag)::type>(args); });
}

void conv_pointwise_matmul_weight_grad(const ConvArgs& args) {
  check_pointwise(args.rel);
  dispatch_float(args.dtype, "conv_pointwise_matmul_weight_grad", "dtype",
                 [&](auto tag) { weight_grad<typename decltype(tag)::type>(args); });
}

}  // namespace lattice::backend::cpu
