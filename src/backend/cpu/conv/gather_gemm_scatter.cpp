// Constraints: CPU; float dtypes (f16, bf16, f32, f64); any relation kind, any kernel volume,
// any edge count. Deterministic: bitwise-identical results for the same inputs and build.
//
// Destination rows (outputs for forward, inputs for input_grad) are cut into chunks of about
// kChunkEdges edges, spread over lattice's OpenMP threads; a chunk's thread walks the offsets k
// in ascending order and, for the chunk's slice of each offset, gathers row blocks of kRowBlock,
// runs one single-threaded BLIS GEMM with W[k] and adds the product rows into the accumulator
// rows it owns; a block whose source and destination rows are both consecutive (a submanifold
// kernel's centre offset) is multiplied in place instead (f32/f64). f32 on a CPU with AVX + FMA
// takes the fused kernel of common/fused_rows.h instead of gather + BLIS + scatter: W[k] packed
// once per call into 16-column panels shared by all chunks, each chunk's slice of an offset read
// and added in place by 6 x 16 register tiles (no copies, no per-call BLIS set-up; issue 17,
// docs/performance.md "GEMM passes"). Input gradient needs the
// input-side views (in_ptr, kt_in, kt_out) and runs on W[k]^T transposed once per call. Weight
// gradient: one work item per (offset, C_in column block), largest first on a dynamic schedule,
// each summed by one thread over its edges in blocks of weight_grad_edge_block(C_in, C_out)
// (f32 on AVX + FMA: fused_weight_grad_f32, register tiles over L1-sized edge blocks read in
// place, no gathered copies).
//
// Shapes (named axes; K = kernel volume, E_k = edges of offset k):
//   x (n_in, C_in), w (K, C_in, C_out), bias (C_out) or null, y (n_out, C_out),
//   dy (n_out, C_out), dx (n_in, C_in), dw (K, C_in, C_out); all of the storage dtype T.
//   Buffers: per thread (kRowBlock, C) gathered and product blocks in Accum<T>; for f16/bf16
//   also W and the output accumulator converted to / held in f32.
// Numerics: GEMMs in Accum<T> (BLIS sgemm for f16/bf16/f32, dgemm for f64); f16/bf16 inputs are
// widened exactly, and each output element is rounded to T once, at the end.
// Determinism: the offsets are summed in a fixed order (k ascending); within one offset every
// output row (input row for input_grad) occurs at most once, so the parallel scatter has no
// races and no atomics. The RelationView guarantees one edge per (o, k); input_grad also relies
// on one edge per (i, k), which every relation rule in SEMANTICS.md satisfies (for a given
// input and offset the rule determines the output coordinate). The blocking, the in-place
// choice and the weight-gradient item order depend only on the data, never on the thread count
// or the schedule, so results are identical for any number of threads.
#include <algorithm>
#include <cstdint>
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

void check_grouping(const RelationView& rel) {
  LATTICE_ASSERT(rel.n_edges == 0 || (rel.k_ptr && rel.k_in && rel.k_out),
                 "conv gather_gemm_scatter: per-offset grouping (k_ptr, k_in, k_out) is null");
}

// Destination rows are cut into chunks of about kChunkEdges edges (a data-only rule, so the
// GEMM blocks, and therefore the results, are the same for any thread count). Each chunk is
// owned by one thread, which walks every offset for its rows: no barrier between offsets and
// the chunk's accumulator rows stay in cache. 8192 edges x 64 channels x 4 B = 2 MiB of
// gathered rows per chunk over all offsets; small enough for dynamic load balance on 2-16
// threads at N ~ 1e5. Estimate (2026-11), to be tuned with the benchmark suite.
constexpr std::int64_t kChunkEdges = 8192;

std::vector<std::int64_t> chunk_bounds(const std::int64_t* ptr, std::int64_t rows) {
  std::vector<std::int64_t> bounds{0};
  std::int64_t start_edges = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    if (ptr[r + 1] - start_edges >= kChunkEdges) {
      bounds.push_back(r + 1);
      start_edges = ptr[r + 1];
    }
  }
  if (bounds.back() != rows) bounds.push_back(rows);
  return bounds;
}


// acc (n_dst, c_dst) += sum_k scatter_{dst_k}(gather_{src_k}(src) @ W_k), W_k = w + k*c_in*c_out
// read with strides (rsw, csw). `dst_rows` / `src_rows` are a per-offset grouping (k_ptr) whose
// segments are sorted by destination row; `dst_ptr` (n_dst + 1) counts edges per destination
// row. Used by forward (dst = outputs) and input_grad (dst = inputs, W^T). The fused f32 path
// (detail::uses_fused_rows<T>()) also initialises acc to `bias` (or zero when null) chunk by chunk; the other
// path expects acc initialised by the caller.
template <class T>
void accumulate_by_destination(const RelationView& rel, const std::int64_t* dst_ptr, std::int64_t n_dst,
                               const std::int32_t* dst_rows, const std::int32_t* src_rows, const T* src,
                               std::int64_t c_src, const Accum<T>* w, std::int64_t rsw, std::int64_t csw,
                               std::int64_t c_dst, Accum<T>* acc, std::int64_t c_in, std::int64_t c_out,
                               const T* bias = nullptr) {
  const std::vector<std::int64_t> bounds = chunk_bounds(dst_ptr, n_dst);
  const auto chunks = static_cast<std::int64_t>(bounds.size()) - 1;
  const int threads = chunks > 1 ? detail::threads_for(rel.n_edges * c_src * c_dst) : 1;
  if constexpr (std::is_same_v<T, float>) {
    if (detail::uses_fused_rows<T>()) {
      // Fused path (fused_rows.h): every W[k] packed once per call into 16-column panels that
      // all chunks share; each chunk's slice of an offset is one call, read and written in place.
      const std::int64_t panel_size = detail::packed_panels_size(c_src, c_dst);
      detail::AlignedFloats packed;
      packed.resize(rel.kernel_volume * panel_size);
#pragma omp parallel num_threads(threads)
      {
#pragma omp for schedule(static)
        for (std::int64_t k = 0; k < rel.kernel_volume; ++k)
          detail::pack_panels(w + k * c_in * c_out, rsw, csw, c_src, c_dst, packed.data + k * panel_size);
#pragma omp for schedule(dynamic, 1)
        for (std::int64_t c = 0; c < chunks; ++c) {
          const std::int64_t r0 = bounds[static_cast<std::size_t>(c)];
          const std::int64_t r1 = bounds[static_cast<std::size_t>(c) + 1];
          // The chunk's own rows start at the bias (or zero) here, in the region that sums into
          // them and while they are about to be used: no separate fill pass and fork/join.
          for (std::int64_t r = r0; r < r1; ++r) {
            float* d = acc + r * c_dst;
            for (std::int64_t j = 0; j < c_dst; ++j) d[j] = bias ? bias[j] : 0.0F;
          }
          for (std::int64_t k = 0; k < rel.kernel_volume; ++k) {
            const std::int32_t* seg = dst_rows + rel.k_ptr[k];
            const std::int32_t* seg_end = dst_rows + rel.k_ptr[k + 1];
            const std::int64_t lo = std::lower_bound(seg, seg_end, r0) - dst_rows;
            const std::int64_t hi = std::lower_bound(seg, seg_end, r1) - dst_rows;
            detail::fused_rows_f32(src, c_src, src_rows, dst_rows, lo, hi, packed.data + k * panel_size, c_dst, acc);
          }
        }
      }
      return;
    }
  }
#pragma omp parallel num_threads(threads)
  {
    detail::Scratch<Accum<T>> scratch;
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t c = 0; c < chunks; ++c) {
      const std::int64_t r0 = bounds[static_cast<std::size_t>(c)];
      const std::int64_t r1 = bounds[static_cast<std::size_t>(c) + 1];
      for (std::int64_t k = 0; k < rel.kernel_volume; ++k) {
        const std::int32_t* seg = dst_rows + rel.k_ptr[k];
        const std::int32_t* seg_end = dst_rows + rel.k_ptr[k + 1];
        const std::int64_t lo = std::lower_bound(seg, seg_end, r0) - dst_rows;
        const std::int64_t hi = std::lower_bound(seg, seg_end, r1) - dst_rows;
        const Accum<T>* wk = w + k * c_in * c_out;
        for (std::int64_t b = lo; b < hi; b += kRowBlock) {
          detail::gemm_rows<T>(src, c_src, src_rows, dst_rows, b, std::min(hi, b + kRowBlock), wk, rsw,
                               csw, c_dst, acc, scratch);
        }
      }
    }
  }
}

// y (n_out, C_out) = bias + sum_k scatter_{k_out}(gather_{k_in}(x) @ W[k]).
template <class T>
void forward(const ConvArgs& a) {
  using A = Accum<T>;
  const RelationView& rel = a.rel;
  check_grouping(rel);
  std::vector<A> acc_buf, w_buf;
  auto* y = static_cast<T*>(a.y);
  A* acc = detail::accum_target(y, rel.n_out * a.c_out, acc_buf);
  const bool fused = rel.n_edges > 0 && detail::uses_fused_rows<T>();  // fills acc chunk by chunk itself
  if (!fused) detail::fill_rows(acc, rel.n_out, a.c_out, static_cast<const T*>(a.bias));
  const A* w = detail::as_accum(static_cast<const T*>(a.w), rel.kernel_volume * a.c_in * a.c_out, w_buf);
  if (rel.n_edges > 0)
    accumulate_by_destination<T>(rel, rel.out_ptr, rel.n_out, rel.k_out, rel.k_in,
                                 static_cast<const T*>(a.x), a.c_in, w, a.c_out, 1, a.c_out, acc,
                                 a.c_in, a.c_out, static_cast<const T*>(a.bias));
  detail::store_all(acc, rel.n_out * a.c_out, y);
}

// dx (n_in, C_in) = sum_k scatter_{k_in}(gather_{k_out}(dy) @ W[k]^T).
template <class T>
void input_grad(const ConvArgs& a) {
  using A = Accum<T>;
  const RelationView& rel = a.rel;
  check_grouping(rel);
  std::vector<A> acc_buf, w_buf;
  auto* dx = static_cast<T*>(a.dx);
  A* acc = detail::accum_target(dx, rel.n_in * a.c_in, acc_buf);
  const bool fused = rel.n_edges > 0 && detail::uses_fused_rows<T>();  // fills acc chunk by chunk itself
  if (!fused) detail::fill_rows<T>(acc, rel.n_in, a.c_in, nullptr);
  if (rel.n_edges > 0) {
    LATTICE_ASSERT(rel.in_ptr && rel.kt_in && rel.kt_out,
                   "conv gather_gemm_scatter input_grad: input-side views (in_ptr, kt_in, kt_out) are null");
    // W[k]^T (C_out, C_in), transposed once into contiguous rows (K * C_in * C_out elements,
    // small next to the edges): read through strides (column stride C_out), BLIS re-packed every
    // per-(chunk, offset) GEMM's B from a transposed view, which made this pass 8-30% slower than
    // the forward on the same relation (issue 17, docs/performance.md).
    // the fused f32 path packs W[k]^T into its panels from the strided view
    const A* wt = static_cast<const A*>(a.w);
    std::int64_t rsw = 1, csw = a.c_out;
    if (!fused) {
      detail::transpose_weights(static_cast<const T*>(a.w), rel.kernel_volume, a.c_in, a.c_out, w_buf);
      wt = w_buf.data();
      rsw = a.c_in;
      csw = 1;
    }
    accumulate_by_destination<T>(rel, rel.in_ptr, rel.n_in, rel.kt_in, rel.kt_out,
                                 static_cast<const T*>(a.dy), a.c_out, wt, rsw, csw, a.c_in, acc, a.c_in,
                                 a.c_out);
  }
  detail::store_all(acc, rel.n_in * a.c_in, dx);
}

// dw[k] (C_in, C_out) = gather_{k_in}(x)^T @ gather_{k_out}(dy); zero for offsets without edges.
// One work item per (offset, C_in column block); each item is summed by one thread.
template <class T>
void weight_grad(const ConvArgs& a) {
  using A = Accum<T>;
  const RelationView& rel = a.rel;
  check_grouping(rel);
  const std::int64_t per_offset = a.c_in * a.c_out;
  std::vector<A> acc_buf;
  auto* dw = static_cast<T*>(a.dw);
  A* acc = detail::accum_target(dw, rel.kernel_volume * per_offset, acc_buf);
  const std::int64_t cb = detail::weight_grad_column_block(rel.kernel_volume, a.c_in);
  const std::int64_t col_blocks = (a.c_in + cb - 1) / cb;
  const std::int64_t items = rel.kernel_volume * col_blocks;
  const int threads = detail::threads_for(rel.n_edges * a.c_in * a.c_out);
  // Largest items first on a dynamic schedule (longest-processing-time order): the offsets'
  // edge counts differ (the centre of a submanifold kernel has one edge per row, the corners
  // few), and a static split of ~27 items over the threads left one thread with up to 1.3x the
  // other's edges. The order is data-only and every item is still summed by one thread in a
  // fixed order, so the result does not depend on the thread count or the schedule.
  std::vector<std::int64_t> order(static_cast<std::size_t>(items));
  for (std::int64_t i = 0; i < items; ++i) order[static_cast<std::size_t>(i)] = i;
  if (rel.n_edges > 0) {
    std::stable_sort(order.begin(), order.end(), [&](std::int64_t l, std::int64_t r) {
      const std::int64_t kl = l / col_blocks, kr = r / col_blocks;
      return rel.k_ptr[kl + 1] - rel.k_ptr[kl] > rel.k_ptr[kr + 1] - rel.k_ptr[kr];
    });
  }
  const bool fused = detail::uses_fused_rows<T>();  // f32 on AVX + FMA: rows read in place (fused_rows.h)
#pragma omp parallel num_threads(threads)
  {
    detail::Scratch<A> scratch;
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t slot = 0; slot < items; ++slot) {
      const std::int64_t item = order[static_cast<std::size_t>(slot)];
      const std::int64_t k = item / col_blocks;
      const std::int64_t c0 = (item % col_blocks) * cb;
      const std::int64_t c1 = std::min(a.c_in, c0 + cb);
      const std::int64_t begin = rel.n_edges > 0 ? rel.k_ptr[k] : 0;
      const std::int64_t n = rel.n_edges > 0 ? rel.k_ptr[k + 1] - begin : 0;
      A* dst = acc + k * per_offset + c0 * a.c_out;
      if (n == 0) {
        std::fill_n(dst, (c1 - c0) * a.c_out, A{0});
        continue;
      }
      if constexpr (std::is_same_v<T, float>) {
        if (fused) {
          detail::fused_weight_grad_f32(static_cast<const float*>(a.x), a.c_in, rel.k_in + begin,
                                        static_cast<const float*>(a.dy), a.c_out, rel.k_out + begin, n, c0,
                                        c1, dst);
          continue;
        }
      }
      detail::weight_grad_rows<T>(static_cast<const T*>(a.x), a.c_in, rel.k_in + begin,
                                  static_cast<const T*>(a.dy), a.c_out, rel.k_out + begin, n, c0, c1,
                                  dst, scratch);
    }
  }
  detail::store_all(acc, rel.kernel_volume * per_offset, dw);
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

LATTICE_ROUTE_KERNELS(ConvKernels, conv_gather_gemm_scatter, {
    .forward = cpu::conv_gather_gemm_scatter_forward,
    .input_grad = cpu::conv_gather_gemm_scatter_input_grad,
    .weight_grad = cpu::conv_gather_gemm_scatter_weight_grad,
    .bias_grad = cpu::conv_reference_bias_grad});
