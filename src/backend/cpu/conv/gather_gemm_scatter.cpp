// Constraints: CPU; float dtypes (f16, bf16, f32, f64); any relation kind, any kernel volume,
// any edge count. Deterministic: bitwise-identical results for the same inputs and build.
//
// Per kernel offset k, in ascending order: gather the rows its edges read into a contiguous
// buffer, multiply by W[k] with one BLAS GEMM, scatter-add the product rows into an
// accumulator. Offsets without edges are skipped.
//
// Shapes (named axes; K = kernel volume, E_k = edges of offset k):
//   x (n_in, C_in), w (K, C_in, C_out), bias (C_out) or null, y (n_out, C_out),
//   dy (n_out, C_out), dx (n_in, C_in), dw (K, C_in, C_out); all of the storage dtype T.
//   Buffers per call: gathered (max E_k, C) and product (max E_k, C) in Accum<T>; for f16/bf16
//   also W and the output accumulator converted to / held in f32.
// Numerics: GEMMs in Accum<T> (sgemm for f16/bf16/f32, dgemm for f64); f16/bf16 inputs are
// widened exactly, and each output element is rounded to T once, at the end.
// Determinism: the offsets are summed in a fixed order (k ascending); within one offset every
// output row (input row for input_grad) occurs at most once, so the parallel scatter has no
// races and no atomics. The RelationView guarantees one edge per (o, k); input_grad also relies
// on one edge per (i, k), which every relation rule in SEMANTICS.md satisfies (for a given
// input and offset the rule determines the output coordinate). BLAS results are reproducible
// for a fixed shape and BLAS thread count (OpenBLAS splits a GEMM over m and n, never k).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "backend/cpu/conv/conv_routes.h"
#include "backend/cpu/conv/gemm_support.h"
#include "lattice/core/error.h"

namespace lattice::backend::cpu {
namespace {

using detail::accum_target;
using detail::as_accum;
using detail::gather_rows;
using detail::gemm;
using detail::scatter_add_rows;
using detail::store_all;

// Largest number of edges of one kernel offset (0 for an empty relation).
std::int64_t max_offset_edges(const RelationView& rel) {
  if (rel.n_edges == 0) return 0;
  LATTICE_ASSERT(rel.k_ptr != nullptr && rel.k_in != nullptr && rel.k_out != nullptr,
                 "conv gather_gemm_scatter: per-offset grouping (k_ptr, k_in, k_out) is null");
  std::int64_t most = 0;
  for (std::int64_t k = 0; k < rel.kernel_volume; ++k) {
    most = std::max(most, rel.k_ptr[k + 1] - rel.k_ptr[k]);
  }
  return most;
}

// y (n_out, C_out) = bias + sum_k scatter_{k_out}(gather_{k_in}(x) @ W[k]).
template <class T>
void forward(const ConvArgs& a) {
  using A = Accum<T>;
  const RelationView& rel = a.rel;
  const std::int64_t rows = max_offset_edges(rel);
  std::vector<A> acc_buf, w_buf;
  std::vector<A> gathered(static_cast<std::size_t>(rows * a.c_in));
  std::vector<A> product(static_cast<std::size_t>(rows * a.c_out));
  auto* y = static_cast<T*>(a.y);
  A* acc = accum_target(y, rel.n_out * a.c_out, acc_buf);
  detail::fill_rows(acc, rel.n_out, a.c_out, static_cast<const T*>(a.bias));
  const A* w = as_accum(static_cast<const T*>(a.w), rel.kernel_volume * a.c_in * a.c_out, w_buf);
  for (std::int64_t k = 0; k < rel.kernel_volume && rows > 0; ++k) {
    const std::int64_t begin = rel.k_ptr[k];
    const std::int64_t n = rel.k_ptr[k + 1] - begin;
    if (n == 0) continue;
    gather_rows(static_cast<const T*>(a.x), a.c_in, rel.k_in + begin, n, gathered.data());
    gemm<A>(false, false, n, a.c_out, a.c_in, gathered.data(), a.c_in, w + k * a.c_in * a.c_out,
            a.c_out, A{0}, product.data(), a.c_out);
    scatter_add_rows(product.data(), a.c_out, rel.k_out + begin, n, acc);
  }
  store_all(acc, rel.n_out * a.c_out, y);
}

// dx (n_in, C_in) = sum_k scatter_{k_in}(gather_{k_out}(dy) @ W[k]^T).
template <class T>
void input_grad(const ConvArgs& a) {
  using A = Accum<T>;
  const RelationView& rel = a.rel;
  const std::int64_t rows = max_offset_edges(rel);
  std::vector<A> acc_buf, w_buf;
  std::vector<A> gathered(static_cast<std::size_t>(rows * a.c_out));
  std::vector<A> product(static_cast<std::size_t>(rows * a.c_in));
  auto* dx = static_cast<T*>(a.dx);
  A* acc = accum_target(dx, rel.n_in * a.c_in, acc_buf);
  detail::fill_rows<T>(acc, rel.n_in, a.c_in, nullptr);
  const A* w = as_accum(static_cast<const T*>(a.w), rel.kernel_volume * a.c_in * a.c_out, w_buf);
  for (std::int64_t k = 0; k < rel.kernel_volume && rows > 0; ++k) {
    const std::int64_t begin = rel.k_ptr[k];
    const std::int64_t n = rel.k_ptr[k + 1] - begin;
    if (n == 0) continue;
    gather_rows(static_cast<const T*>(a.dy), a.c_out, rel.k_out + begin, n, gathered.data());
    gemm<A>(false, true, n, a.c_in, a.c_out, gathered.data(), a.c_out, w + k * a.c_in * a.c_out,
            a.c_out, A{0}, product.data(), a.c_in);
    scatter_add_rows(product.data(), a.c_in, rel.k_in + begin, n, acc);
  }
  store_all(acc, rel.n_in * a.c_in, dx);
}

// dw[k] (C_in, C_out) = gather_{k_in}(x)^T @ gather_{k_out}(dy); zero for offsets without edges.
template <class T>
void weight_grad(const ConvArgs& a) {
  using A = Accum<T>;
  const RelationView& rel = a.rel;
  const std::int64_t rows = max_offset_edges(rel);
  const std::int64_t per_offset = a.c_in * a.c_out;
  std::vector<A> gathered_x(static_cast<std::size_t>(rows * a.c_in));
  std::vector<A> gathered_dy(static_cast<std::size_t>(rows * a.c_out));
  std::vector<A> dwk_buf;
  auto* dw = static_cast<T*>(a.dw);
  for (std::int64_t k = 0; k < rel.kernel_volume; ++k) {
    T* dwk = dw + k * per_offset;
    A* acc = accum_target(dwk, per_offset, dwk_buf);
    const std::int64_t begin = rows > 0 ? rel.k_ptr[k] : 0;
    const std::int64_t n = rows > 0 ? rel.k_ptr[k + 1] - begin : 0;
    if (n == 0) {
      std::fill_n(dwk, per_offset, store<T>(A{0}));
      continue;
    }
    gather_rows(static_cast<const T*>(a.x), a.c_in, rel.k_in + begin, n, gathered_x.data());
    gather_rows(static_cast<const T*>(a.dy), a.c_out, rel.k_out + begin, n, gathered_dy.data());
    gemm<A>(true, false, a.c_in, a.c_out, n, gathered_x.data(), a.c_in, gathered_dy.data(), a.c_out,
            A{0}, acc, a.c_out);
    store_all(acc, per_offset, dwk);
  }
}

}  // namespace

void conv_gather_gemm_scatter_forward(const ConvArgs& args) {
  dispatch_float(args.dtype, "conv_gather_gemm_scatter_forward", "dtype",
                 [&](auto tag) { forward<typename decltype(tag)::type>(args); });
}

void conv_gather_gemm_scatter_input_grad(const ConvArgs& args) {
  dispatch_float(args.dtype, "conv_gather_gemm_scatter_input_grad", "dtype",
                 [&](auto tag) { input_grad<typename decltype(tag)::type>(args); });
}

void conv_gather_gemm_scatter_weight_grad(const ConvArgs& args) {
  dispatch_float(args.dtype, "conv_gather_gemm_scatter_weight_grad", "dtype",
                 [&](auto tag) { weight_grad<typename decltype(tag)::type>(args); });
}

}  // namespace lattice::backend::cpu
