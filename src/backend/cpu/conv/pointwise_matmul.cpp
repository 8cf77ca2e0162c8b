// Constraints: CPU; kernel volume 1; identity relation (edges exactly (i, i, 0) for every row,
// so n_in == n_out); float dtypes (f16, bf16, f32, f64). Deterministic.
//
// A 1x1x1 convolution at stride 1 without padding or target is a matmul over rows
// (SEMANTICS.md "Convolution"): row blocks of one GEMM per pass spread over lattice's threads
// (single-threaded BLIS per block, see gemm_support.h), no edge lists read.
//
// Shapes (named axes; N = n_in = n_out): x (N, C_in), w (1, C_in, C_out), bias (C_out) or null,
// y (N, C_out), dy (N, C_out), dx (N, C_in), dw (1, C_in, C_out); all of the storage dtype T.
//   forward     y  = x @ W[0] + bias
//   input_grad  dx = dy @ W[0]^T
//   weight_grad dw[0] = x^T @ dy
// Numerics: GEMMs in Accum<T> (sgemm for f16/bf16/f32, dgemm for f64); f16/bf16 operands are
// widened to f32 per block and each output element is rounded to T once, at the end.
// f32 on a CPU with AVX + FMA takes the fused register-tile kernels of common/fused_rows.h
// instead of BLIS (issue 17): W (W^T for the input gradient) packed once per call into
// 16-column panels, rows read and written in place, each block of rows initialising its own
// output rows in the region that sums into them; the weight gradient's column-block items run
// fused_weight_grad_f32 over all rows when C_out is a multiple of 16 and C_in + C_out <= 256
// (BLIS's direct GEMM otherwise; see weight_grad). BLIS read W^T through strides in the input
// gradient and ran the 1x1 passes at 35-70 GFLOP/s on one core on kitti (docs/performance.md,
// "Issue 17: the phases outside the GEMMs, the pointwise route and Linear"). Determinism: each output element is one FMA chain over the channels added once
// onto the bias / zero (forward, input grad), or a fixed edge-block order (weight grad); none of
// it depends on the row blocks' assignment to threads.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <type_traits>
#include <vector>

#include "backend/cpu/common/fused_rows.h"
#include "backend/cpu/common/gemm_support.h"
#include "backend/cpu/conv/conv_routes.h"
#include "backend/kernels.h"
#include "lattice/core/error.h"

namespace lattice::backend::cpu {
namespace {

using detail::kRowBlock;

void check_pointwise(const RelationView& rel) {
  LATTICE_ASSERT(rel.kernel_volume == 1 && rel.identity && rel.n_in == rel.n_out,
                 "conv pointwise_matmul: requires kernel volume 1 and the identity relation");
}

// acc (n, c_dst) += src (n, c_src) @ W with W strides (rsw, csw), in row blocks.
template <class T>
void blocked_matmul(const T* src, std::int64_t n, std::int64_t c_src, const Accum<T>* w,
                    std::int64_t rsw, std::int64_t csw, std::int64_t c_dst, Accum<T>* acc) {
  const std::int64_t blocks = (n + kRowBlock - 1) / kRowBlock;
  const int threads = detail::threads_for(n * c_src * c_dst);
#pragma omp parallel num_threads(threads)
  {
    detail::Scratch<Accum<T>> scratch;
#pragma omp for schedule(static)
    for (std::int64_t b = 0; b < blocks; ++b) {
      const std::int64_t r0 = b * kRowBlock;
      detail::gemm_rows<T>(src, c_src, nullptr, nullptr, r0, std::min(n, r0 + kRowBlock), w, rsw,
                           csw, c_dst, acc, scratch);
    }
  }
}

// Rows per work item of the fused passes (a multiple of the 6-row tile).
constexpr std::int64_t kFusedRowBlock = 1536;

// 0, 1, ..., n - 1: the identity row list the fused kernels read.
std::vector<std::int32_t> identity_rows(std::int64_t n) {
  std::vector<std::int32_t> rows(static_cast<std::size_t>(n));
  std::iota(rows.begin(), rows.end(), 0);
  return rows;
}

// acc (n, c_dst) = init + src (n, c_src) @ W, W's element (ci, co) at w[ci * rsw + co * csw];
// init: bias (c_dst) or zero. f32, fused kernels (fused_rows_available()).
void fused_matmul(const float* src, std::int64_t n, std::int64_t c_src, const float* w, std::int64_t rsw,
                  std::int64_t csw, std::int64_t c_dst, const float* bias, float* acc) {
  detail::AlignedFloats packed;
  packed.resize(detail::packed_panels_size(c_src, c_dst));
  detail::pack_panels(w, rsw, csw, c_src, c_dst, packed.data);
  const std::vector<std::int32_t> rows = identity_rows(n);
  const std::int64_t blocks = (n + kFusedRowBlock - 1) / kFusedRowBlock;
  const int threads = blocks > 1 ? detail::threads_for(n * c_src * c_dst) : 1;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::int64_t r0 = b * kFusedRowBlock;
    const std::int64_t r1 = std::min(n, r0 + kFusedRowBlock);
    for (std::int64_t r = r0; r < r1; ++r) {
      float* d = acc + r * c_dst;
      for (std::int64_t j = 0; j < c_dst; ++j) d[j] = bias ? bias[j] : 0.0F;
    }
    detail::fused_rows_f32(src, c_src, rows.data(), rows.data(), r0, r1, packed.data, c_dst, acc);
  }
}


template <class T>
void forward(const ConvArgs& a) {
  using A = Accum<T>;
  const std::int64_t n = a.rel.n_out;
  if constexpr (std::is_same_v<T, float>) {
    if (detail::uses_fused_rows<T>()) {
      fused_matmul(static_cast<const float*>(a.x), n, a.c_in, static_cast<const float*>(a.w), a.c_out, 1, a.c_out,
                   static_cast<const float*>(a.bias), static_cast<float*>(a.y));
      return;
    }
  }
  std::vector<A> acc_buf, w_buf;
  auto* y = static_cast<T*>(a.y);
  A* acc = detail::accum_target(y, n * a.c_out, acc_buf);
  detail::fill_rows(acc, n, a.c_out, static_cast<const T*>(a.bias));
  const A* w = detail::as_accum(static_cast<const T*>(a.w), a.c_in * a.c_out, w_buf);
  blocked_matmul<T>(static_cast<const T*>(a.x), n, a.c_in, w, a.c_out, 1, a.c_out, acc);
  detail::store_all(acc, n * a.c_out, y);
}

template <class T>
void input_grad(const ConvArgs& a) {
  using A = Accum<T>;
  const std::int64_t n = a.rel.n_in;
  if constexpr (std::is_same_v<T, float>) {
    if (detail::uses_fused_rows<T>()) {  // W[0]^T packed straight from its strides (row 1, column C_out)
      fused_matmul(static_cast<const float*>(a.dy), n, a.c_out, static_cast<const float*>(a.w), 1, a.c_out, a.c_in,
                   nullptr, static_cast<float*>(a.dx));
      return;
    }
  }
  std::vector<A> acc_buf, w_buf;
  auto* dx = static_cast<T*>(a.dx);
  A* acc = detail::accum_target(dx, n * a.c_in, acc_buf);
  detail::fill_rows<T>(acc, n, a.c_in, nullptr);
  const A* w = detail::as_accum(static_cast<const T*>(a.w), a.c_in * a.c_out, w_buf);
  // W[0]^T (C_out, C_in): row stride 1, column stride C_out.
  blocked_matmul<T>(static_cast<const T*>(a.dy), n, a.c_out, w, 1, a.c_out, a.c_in, acc);
  detail::store_all(acc, n * a.c_in, dx);
}

template <class T>
void weight_grad(const ConvArgs& a) {
  using A = Accum<T>;
  const std::int64_t n = a.rel.n_in;
  std::vector<A> acc_buf;
  auto* dw = static_cast<T*>(a.dw);
  A* acc = detail::accum_target(dw, a.c_in * a.c_out, acc_buf);
  const std::int64_t cb = detail::weight_grad_column_block(1, a.c_in);
  const std::int64_t items = (a.c_in + cb - 1) / cb;
  const int threads = detail::threads_for(n * a.c_in * a.c_out);
  // The fused weight gradient re-adds its tiles every 16-32 rows (fused_weight_grad_edge_block)
  // and sweeps all rows once per column block: in the kitti network it beat BLIS's one direct
  // GEMM per column block for narrow, 16-aligned outputs (C_in + C_out <= 256: (32, 64), (64,
  // 128), (128, 96): -20 to -40%) and lost for wide ones ((384, 256): +30%) and for C_out = 19
  // (a padded second panel); those keep BLIS.
  const bool fused = detail::uses_fused_rows<T>() && n > 0 && a.c_out % detail::kPanelCols == 0 && a.c_in + a.c_out <= 256;
  const std::vector<std::int32_t> rows = fused ? identity_rows(n) : std::vector<std::int32_t>{};
#pragma omp parallel num_threads(threads)
  {
    detail::Scratch<A> scratch;
#pragma omp for schedule(static)
    for (std::int64_t item = 0; item < items; ++item) {
      const std::int64_t c0 = item * cb;
      const std::int64_t c1 = std::min(a.c_in, c0 + cb);
      if constexpr (std::is_same_v<T, float>) {
        if (fused) {
          detail::fused_weight_grad_f32(static_cast<const float*>(a.x), a.c_in, rows.data(),
                                        static_cast<const float*>(a.dy), a.c_out, rows.data(), n, c0, c1,
                                        acc + c0 * a.c_out);
          continue;
        }
      }
      detail::weight_grad_rows<T>(static_cast<const T*>(a.x), a.c_in, nullptr,
                                  static_cast<const T*>(a.dy), a.c_out, nullptr, n, c0, c1,
                                  acc + c0 * a.c_out, scratch);
    }
  }
  detail::store_all(acc, a.c_in * a.c_out, dw);
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

LATTICE_ROUTE_KERNELS(ConvKernels, conv_pointwise_matmul, {
    .forward = cpu::conv_pointwise_matmul_forward,
    .input_grad = cpu::conv_pointwise_matmul_input_grad,
    .weight_grad = cpu::conv_pointwise_matmul_weight_grad,
    .bias_grad = cpu::conv_reference_bias_grad});
