// Constraints: CPU; any float dtype (f16, bf16, f32, f64); any relation kind, any kernel volume,
// any edge count (including none). Deterministic (single-threaded, fixed summation order).
//
// The scalar reference route: plain loops over the relation's edge lists, written to be
// obviously correct rather than fast. Every other CPU and CUDA route is tested against it.
//
// Shapes (named axes; K = kernel volume, E = edges):
//   x (n_in, C_in), w (K, C_in, C_out), bias (C_out) or null, y (n_out, C_out),
//   dy (n_out, C_out), dx (n_in, C_in), dw (K, C_in, C_out); all of the storage dtype T.
// Numerics: products and sums in Accum<T> (f32 for f16/bf16/f32, f64 for f64); each output
// element is rounded to T once, after its last term. Summation orders:
//   forward     y[o]  = bias + sum over the edges of o in output-major order (o, k),
//   input_grad  dx[i] = sum over all edges in output-major order,
//   weight_grad dw[k] = sum over the edges of k in per-offset order (k, o).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/cpu/conv/conv_routes.h"
#include "backend/kernels.h"
#include "lattice/core/error.h"

namespace lattice::backend::cpu {
namespace {

template <class T>
void forward(const ConvArgs& a) {
  using A = Accum<T>;
  const RelationView& rel = a.rel;
  const auto* x = static_cast<const T*>(a.x);
  const auto* w = static_cast<const T*>(a.w);
  const auto* bias = static_cast<const T*>(a.bias);
  auto* y = static_cast<T*>(a.y);
  std::vector<A> acc(static_cast<std::size_t>(a.c_out));
  for (std::int64_t o = 0; o < rel.n_out; ++o) {
    for (std::int64_t co = 0; co < a.c_out; ++co) acc[co] = bias ? load(bias[co]) : A{0};
    for (std::int64_t e = rel.out_ptr[o]; e < rel.out_ptr[o + 1]; ++e) {
      const T* xi = x + std::int64_t{rel.in_idx[e]} * a.c_in;
      const T* wk = w + std::int64_t{rel.k_idx[e]} * a.c_in * a.c_out;
      for (std::int64_t ci = 0; ci < a.c_in; ++ci) {
        const A xv = load(xi[ci]);
        for (std::int64_t co = 0; co < a.c_out; ++co) acc[co] += xv * load(wk[ci * a.c_out + co]);
      }
    }
    for (std::int64_t co = 0; co < a.c_out; ++co) y[o * a.c_out + co] = store<T>(acc[co]);
  }
}

template <class T>
void input_grad(const ConvArgs& a) {
  using A = Accum<T>;
  const RelationView& rel = a.rel;
  const auto* dy = static_cast<const T*>(a.dy);
  const auto* w = static_cast<const T*>(a.w);
  auto* dx = static_cast<T*>(a.dx);
  std::vector<A> acc(static_cast<std::size_t>(rel.n_in * a.c_in), A{0});
  for (std::int64_t e = 0; e < rel.n_edges; ++e) {
    const T* dyo = dy + std::int64_t{rel.out_idx[e]} * a.c_out;
    const T* wk = w + std::int64_t{rel.k_idx[e]} * a.c_in * a.c_out;
    A* dxi = acc.data() + std::int64_t{rel.in_idx[e]} * a.c_in;
    for (std::int64_t ci = 0; ci < a.c_in; ++ci) {
      for (std::int64_t co = 0; co < a.c_out; ++co) {
        dxi[ci] += load(dyo[co]) * load(wk[ci * a.c_out + co]);
      }
    }
  }
  for (std::int64_t j = 0; j < rel.n_in * a.c_in; ++j) dx[j] = store<T>(acc[j]);
}

template <class T>
void weight_grad(const ConvArgs& a) {
  using A = Accum<T>;
  const RelationView& rel = a.rel;
  const auto* x = static_cast<const T*>(a.x);
  const auto* dy = static_cast<const T*>(a.dy);
  auto* dw = static_cast<T*>(a.dw);
  const std::int64_t per_offset = a.c_in * a.c_out;
  std::vector<A> acc(static_cast<std::size_t>(rel.kernel_volume * per_offset), A{0});
  for (std::int64_t k = 0; k < rel.kernel_volume && rel.n_edges > 0; ++k) {
    A* dwk = acc.data() + k * per_offset;
    for (std::int64_t e = rel.k_ptr[k]; e < rel.k_ptr[k + 1]; ++e) {
      const T* xi = x + std::int64_t{rel.k_in[e]} * a.c_in;
      const T* dyo = dy + std::int64_t{rel.k_out[e]} * a.c_out;
      for (std::int64_t ci = 0; ci < a.c_in; ++ci) {
        const A xv = load(xi[ci]);
        for (std::int64_t co = 0; co < a.c_out; ++co) dwk[ci * a.c_out + co] += xv * load(dyo[co]);
      }
    }
  }
  for (std::int64_t j = 0; j < rel.kernel_volume * per_offset; ++j) dw[j] = store<T>(acc[j]);
}

}  // namespace

void conv_reference_forward(const ConvArgs& args) {
  LATTICE_ASSERT(args.rel.n_out == 0 || args.rel.out_ptr != nullptr,
                 "conv reference forward: out_ptr is null");
  dispatch_float(args.dtype, "conv_reference_forward", "dtype",
                 [&](auto tag) { forward<typename decltype(tag)::type>(args); });
}

void conv_reference_input_grad(const ConvArgs& args) {
  dispatch_float(args.dtype, "conv_reference_input_grad", "dtype",
                 [&](auto tag) { input_grad<typename decltype(tag)::type>(args); });
}

void conv_reference_bias_grad(const ConvArgs& args) {
  dispatch_float(args.dtype, "conv_reference_bias_grad", "dtype", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* src = static_cast<const T*>(args.dy);
    T* dst = static_cast<T*>(args.dbias);
    const std::int64_t n = args.rel.n_out, c = args.c_out;
    std::vector<Accum<T>> acc(static_cast<std::size_t>(c), Accum<T>(0));
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < c; ++j) acc[static_cast<std::size_t>(j)] += load(src[i * c + j]);
    for (std::int64_t j = 0; j < c; ++j) dst[j] = store<T>(acc[static_cast<std::size_t>(j)]);
  });
}

void conv_reference_weight_grad(const ConvArgs& args) {
  LATTICE_ASSERT(args.rel.n_edges == 0 || args.rel.k_ptr != nullptr,
                 "conv reference weight_grad: k_ptr is null");
  dispatch_float(args.dtype, "conv_reference_weight_grad", "dtype",
                 [&](auto tag) { weight_grad<typename decltype(tag)::type>(args); });
}

}  // namespace lattice::backend::cpu

LATTICE_ROUTE_KERNELS(ConvKernels, conv_reference, {
    .forward = cpu::conv_reference_forward,
    .input_grad = cpu::conv_reference_input_grad,
    .weight_grad = cpu::conv_reference_weight_grad,
    .bias_grad = cpu::conv_reference_bias_grad});
