// Fused gather-GEMM-scatter for f32 on x86-64 with AVX + FMA (issue 17, the GEMM passes; 256-bit
// float vectors only, so AVX2 is not needed).
// Private to src/backend/cpu/.
//
// What it replaces: gemm_support.h's gemm_rows copies a block of gathered source rows into a
// scratch matrix, runs one BLIS sgemm on it into a second scratch matrix and adds that product
// into the destination rows. On kitti-sized relations the two copies took as long as the GEMM
// (rows 1-2 KB apart in a 10-30 MB matrix: every row a cache miss the copy loop waits for), and
// every one of the thousands of per-(chunk, offset) calls paid BLIS's set-up. Here a register
// tile of up to 6 rows x 16 columns reads its source rows where they lie, multiplies them with
// W packed once per call into 16-column panels, and adds the tile straight into the destination
// rows: no copies, no per-call set-up, and no short-m inefficiency.
//
// Numerics and determinism: each destination element gets one add of its product per call,
// the product summed over c_src in ascending order with fused multiply-adds; this depends on
// the data only (not on the tiling, the block sizes or the thread count), so results are
// bitwise identical for any number of threads and every run on one machine. (The BLIS path's
// products are summed in a different order: the two paths agree to rounding, not bitwise.)
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

namespace lattice::backend::cpu::detail {

// Columns per packed panel (two 8-float AVX vectors).
inline constexpr std::int64_t kPanelCols = 16;

// True when this CPU has AVX and FMA (with the OS saving the 256-bit registers) and the fused
// kernels are enabled (the default).
bool fused_rows_available();
// Whether the f32 fused kernels run a pass whose storage type is T: float on a CPU where they are
// available; every other type takes the BLIS path.
template <class T>
bool uses_fused_rows() {
  if constexpr (std::is_same_v<T, float>) {
    return fused_rows_available();
  } else {
    return false;
  }
}

// Test hook: false makes fused_rows_available() return false, so the f32 callers take the BLIS
// path (gemm_rows); true restores the default. Not thread-safe: call between kernel calls.
void set_fused_rows_enabled(bool enabled);

// W (c_src, c_dst), element (ci, co) at w[ci * rsw + co * csw], into `out` as
// ceil(c_dst / 16) panels of (c_src, 16) contiguous floats, columns past c_dst zero.
// out must hold packed_panels_size(c_src, c_dst) floats.
std::int64_t packed_panels_size(std::int64_t c_src, std::int64_t c_dst);
void pack_panels(const float* w, std::int64_t rsw, std::int64_t csw, std::int64_t c_src,
                 std::int64_t c_dst, float* out);

// acc[dst_rows[r], :] += src[src_rows[r], :] @ W for r in [r0, r1), W packed by pack_panels.
// src (*, c_src), acc (*, c_dst). Precondition: fused_rows_available(); dst_rows distinct within
// the range (the calling thread owns them).
void fused_rows_f32(const float* src, std::int64_t c_src, const std::int32_t* src_rows,
                    const std::int32_t* dst_rows, std::int64_t r0, std::int64_t r1,
                    const float* packed_w, std::int64_t c_dst, float* acc);

// Weight gradient over gathered rows, in place:
//   dw_rows (c1 - c0, c_dy) = sum_e x[x_rows[e], c0:c1]^T dy[dy_rows[e], :] for e in [0, n)
// (overwritten). Edges run in blocks of fused_weight_grad_edge_block(c1 - c0, c_dy); each
// block's 6 x 16 register tiles are summed over the block's edges in order and added once into
// dw_rows, blocks in order: a fixed, data-only summation order. Precondition:
// fused_rows_available(); row lists non-null.
inline constexpr std::int64_t kMaxWeightGradBlock = 256;
std::int64_t fused_weight_grad_edge_block(std::int64_t c_x, std::int64_t c_dy);
void fused_weight_grad_f32(const float* x, std::int64_t c_x, const std::int32_t* x_rows, const float* dy,
                           std::int64_t c_dy, const std::int32_t* dy_rows, std::int64_t n, std::int64_t c0,
                           std::int64_t c1, float* dw_rows);

// A 64-byte aligned float buffer (panels are read with aligned loads).
struct AlignedFloats {
  std::vector<float> storage;
  float* data = nullptr;
  void resize(std::int64_t count);
};

}  // namespace lattice::backend::cpu::detail
