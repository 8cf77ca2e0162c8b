// Constraints: CPU; float32, float16 or bfloat16 activations; a BLAS library in the build; any
// relation kind (and linear: rows times W, no relation), any kernel volume, bits 4 / 8, group 32 /
// 64 / 128, scales f16 / bf16 / f32. Forward only. Deterministic.
//
// The gather / GEMM / scatter structure of the float gather_gemm_scatter route, with the packed
// weight dequantized inside the loop: destination (output) rows are cut into chunks of about
// kChunkEdges edges (a data-only rule) and the chunks are split statically into one contiguous
// part per thread. A part walks the offsets k in ascending order; for each C_in tile of W[k]
// (a multiple of the group, at most kTileElems weights) it decodes the tile into a per-thread
// buffer, then for each of its chunks gathers row blocks of kRowBlock edges (the tile's columns),
// runs one single-threaded BLIS GEMM against the tile and adds the product rows into the
// accumulator rows it owns. No dequantized copy of the whole weight is made: each thread holds
// one (tile, C_out) buffer, decoded once per (part, offset, tile) and only for offsets with edges
// in the part. Identity relations (linear, 1x1x1 identity) read no edge lists: row blocks of x
// multiply the tile directly.
//
// Shapes (K = kernel volume, W = C_in_st*bits/32): x (n_in, C_in), y (n_out, C_out), bias (C_out)
// or null, all of the activation dtype T; packed / scales / biases as QuantizedWeightArgs.
// Numerics: GEMMs in f32 (sgemm); f16/bf16 activations widened exactly; weights decoded to the
// exact values dequantize_weight() gives, rounded to T (decode.h); every output element rounded
// to T once, at the end. With one tile (C_in * C_out <= kTileElems) the summation order is that
// of gather_gemm_scatter on the dequantized weight.
// Determinism: offsets and tiles are summed in a fixed order; within one offset every output row
// occurs at most once and each row is owned by one part, so there are no races and no atomics.
// The row blocks are data-defined and a GEMM row's result does not depend on the other rows of
// its call, so the result is the same for any thread count.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "backend/cpu/common/gemm_support.h"
#include "backend/cpu/quantized/decode.h"
#include "backend/kernels.h"
#include "lattice/core/error.h"

namespace lattice::backend::cpu {
namespace {

using detail::kRowBlock;

// Edges per chunk (as gather_gemm_scatter) and the largest decoded tile (64 Ki weights = 256 KiB
// of f32, in L2 beside the gathered rows). Estimates (2026-12), to be tuned with lattice.bench.
constexpr std::int64_t kChunkEdges = 8192;
constexpr std::int64_t kTileElems = std::int64_t{1} << 16;
// Identity relations: rows per chunk.
constexpr std::int64_t kIdentityChunkRows = 8 * kRowBlock;

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

std::int64_t tile_rows(const QuantizedWeightArgs& w) {
  const std::int64_t g = w.group_size;
  const std::int64_t fit = std::max<std::int64_t>(g, (kTileElems / std::max<std::int64_t>(w.c_out, 1)) / g * g);
  return std::min(fit, (w.c_in + g - 1) / g * g);
}

template <class T>
struct Buffers {
  std::vector<Accum<T>> tile;  // decoded (rows, C_out) or (C_out, rows)
  std::vector<Accum<T>> src;   // (kRowBlock, rows) gathered
  std::vector<Accum<T>> dst;   // (kRowBlock, C_out) product
};

template <class T, class S>
void forward(const QuantizedConvArgs& a) {
  using A = Accum<T>;
  const RelationView& rel = a.rel;
  const QuantizedWeightArgs& w = a.w;
  const std::int64_t c_in = w.c_in, c_out = w.c_out;
  std::vector<A> acc_buf;
  auto* y = static_cast<T*>(a.y);
  const auto* x = static_cast<const T*>(a.x);
  A* acc = detail::accum_target(y, rel.n_out * c_out, acc_buf);
  detail::fill_rows(acc, rel.n_out, c_out, static_cast<const T*>(a.bias));
  const std::int64_t rows_per_tile = tile_rows(w);
  // B (ci, co) strides of a decoded tile of `rows` rows.
  auto rsb = [&](std::int64_t) { return w.by_output ? std::int64_t{1} : c_out; };
  auto csb = [&](std::int64_t rows) { return w.by_output ? rows : std::int64_t{1}; };
  const bool identity = rel.identity && rel.kernel_volume == 1;

  if (identity) {
    LATTICE_ASSERT(rel.n_in == rel.n_out, "quantized fused_dequant_gemm: identity relation with n_in != n_out");
    const std::int64_t n = rel.n_out;
    const std::int64_t chunks = (n + kIdentityChunkRows - 1) / kIdentityChunkRows;
    const int threads = chunks > 1 ? detail::threads_for(n * c_in * c_out) : 1;
    const std::int64_t parts = std::min<std::int64_t>(threads, chunks);
#pragma omp parallel for schedule(static, 1) num_threads(threads)
    for (std::int64_t part = 0; part < parts; ++part) {
      const std::int64_t r_begin = std::min(n, (chunks * part / parts) * kIdentityChunkRows);
      const std::int64_t r_end = std::min(n, (chunks * (part + 1) / parts) * kIdentityChunkRows);
      Buffers<T> buf;
      for (std::int64_t ci0 = 0; ci0 < c_in; ci0 += rows_per_tile) {
        const std::int64_t ci1 = std::min(c_in, ci0 + rows_per_tile), rows = ci1 - ci0;
        buf.tile.resize(static_cast<std::size_t>(rows * c_out));
        qdetail::decode_rows<T, S>(w, 0, ci0, ci1, buf.tile.data());
        for (std::int64_t r0 = r_begin; r0 < r_end; r0 += kRowBlock) {
          const std::int64_t m = std::min(r_end, r0 + kRowBlock) - r0;
          const A* src = nullptr;
          std::int64_t rsa = rows;
          if constexpr (detail::kStorageIsAccum<T>) {
            src = reinterpret_cast<const A*>(x) + r0 * c_in + ci0;
            rsa = c_in;
          } else {
            buf.src.resize(static_cast<std::size_t>(kRowBlock * rows));
            for (std::int64_t r = 0; r < m; ++r) {
              const T* from = x + (r0 + r) * c_in + ci0;
              A* to = buf.src.data() + r * rows;
              for (std::int64_t j = 0; j < rows; ++j) to[j] = load(from[j]);
            }
            src = buf.src.data();
          }
          detail::gemm<A>(m, c_out, rows, src, rsa, 1, buf.tile.data(), rsb(rows), csb(rows), A{1},
                          acc + r0 * c_out, c_out, 1);
        }
      }
    }
  } else if (rel.n_edges > 0) {
    LATTICE_ASSERT(rel.k_ptr && rel.k_in && rel.k_out && rel.out_ptr,
                   "quantized fused_dequant_gemm: per-offset grouping (k_ptr, k_in, k_out, out_ptr) is null");
    const std::vector<std::int64_t> bounds = chunk_bounds(rel.out_ptr, rel.n_out);
    const auto chunks = static_cast<std::int64_t>(bounds.size()) - 1;
    const int threads = chunks > 1 ? detail::threads_for(rel.n_edges * c_in * c_out) : 1;
    const std::int64_t parts = std::min<std::int64_t>(threads, chunks);
#pragma omp parallel for schedule(static, 1) num_threads(threads)
    for (std::int64_t part = 0; part < parts; ++part) {
      const std::int64_t c_begin = chunks * part / parts, c_end = chunks * (part + 1) / parts;
      Buffers<T> buf;
      for (std::int64_t k = 0; k < rel.kernel_volume; ++k) {
        const std::int32_t* seg = rel.k_out + rel.k_ptr[k];
        const std::int32_t* seg_end = rel.k_out + rel.k_ptr[k + 1];
        const std::int32_t* part_lo = std::lower_bound(seg, seg_end, bounds[static_cast<std::size_t>(c_begin)]);
        const std::int32_t* part_hi = std::lower_bound(part_lo, seg_end, bounds[static_cast<std::size_t>(c_end)]);
        if (part_lo == part_hi) continue;  // no edges of offset k in this part: nothing decoded
        for (std::int64_t ci0 = 0; ci0 < c_in; ci0 += rows_per_tile) {
          const std::int64_t ci1 = std::min(c_in, ci0 + rows_per_tile), rows = ci1 - ci0;
          buf.tile.resize(static_cast<std::size_t>(rows * c_out));
          qdetail::decode_rows<T, S>(w, k, ci0, ci1, buf.tile.data());
          buf.src.resize(static_cast<std::size_t>(kRowBlock * rows));
          buf.dst.resize(static_cast<std::size_t>(kRowBlock * c_out));
          const std::int32_t* lo = part_lo;
          for (std::int64_t c = c_begin; c < c_end; ++c) {
            const std::int32_t* hi = std::lower_bound(lo, part_hi, bounds[static_cast<std::size_t>(c) + 1]);
            const std::int64_t e_lo = lo - rel.k_out, e_hi = hi - rel.k_out;
            for (std::int64_t b = e_lo; b < e_hi; b += kRowBlock) {
              const std::int64_t m = std::min(e_hi, b + kRowBlock) - b;
              for (std::int64_t r = 0; r < m; ++r) {
                const T* from = x + std::int64_t{rel.k_in[b + r]} * c_in + ci0;
                A* to = buf.src.data() + r * rows;
                for (std::int64_t j = 0; j < rows; ++j) to[j] = load(from[j]);
              }
              detail::gemm<A>(m, c_out, rows, buf.src.data(), rows, 1, buf.tile.data(), rsb(rows), csb(rows),
                              A{0}, buf.dst.data(), c_out, 1);
              for (std::int64_t r = 0; r < m; ++r) {
                const A* from = buf.dst.data() + r * c_out;
                A* to = acc + std::int64_t{rel.k_out[b + r]} * c_out;
                for (std::int64_t j = 0; j < c_out; ++j) to[j] += from[j];
              }
            }
            lo = hi;
          }
        }
      }
    }
  }
  detail::store_all(acc, rel.n_out * c_out, y);
}

}  // namespace

void quantized_fused_dequant_gemm_forward(const QuantizedConvArgs& args) {
  const auto run = [&](auto t_tag) {
    using T = typename decltype(t_tag)::type;
    if constexpr (std::is_same_v<T, double>) {
      throw_unsupported_dtype("quantized_fused_dequant_gemm", "dtype", args.dtype, "float16, bfloat16 or float32");
    } else {
      qdetail::dispatch_scale(args.w.scale_dtype, "quantized_fused_dequant_gemm", [&](auto s_tag) {
        forward<T, typename decltype(s_tag)::type>(args);
      });
    }
  };
  dispatch_float(args.dtype, "quantized_fused_dequant_gemm", "dtype", run);
}

}  // namespace lattice::backend::cpu

LATTICE_ROUTE_KERNELS(QuantizedKernels, quantized_fused_dequant_gemm, {
    .forward = cpu::quantized_fused_dequant_gemm_forward});
