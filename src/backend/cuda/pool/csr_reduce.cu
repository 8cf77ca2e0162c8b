// Constraints: CUDA device (needs_cuda: a CUDA build with a device); any float dtype (f16, bf16,
// f32, f64); any pool mode (sum, avg, max, weighted), any edge list (including none), forward
// and input_grad. Deterministic: no float atomics; bitwise-identical repeated runs, and the
// summation orders of the CPU routes (cpu/pool/pool_routes.h), so max and its gradient match
// them bit for bit and sums agree to rounding (f32/f64 round-to-nearest adds, no FMA).
//
// Forward: one thread per (output row, channel) over the output-major CSR (out_ptr, in_idx);
// consecutive threads read consecutive channels of one input row (coalesced).
// Input gradient: the input-major copy of the edge list is built on the device by a stable
// radix sort of (input row, edge id) pairs, so the edges of an input row come with their output
// row ascending; then one thread per (input row, channel) gathers dy (no scatter, no atomics).
// Also here: the device builders of the edge lists of global pooling (stable radix sort of the
// rows by batch id) and trilinear upsampling (coarse neighbours through the device coordinate
// table), used by ops/pool.cpp for CUDA coordinates.
//
// Shapes (named axes; C = channels, E = edges): x (n_in, C), y (n_out, C), argmax (n_out, C)
// int32, dy (n_out, C), dx (n_in, C), weights (E) float64. Buffers for the input gradient:
// int32 (E) x 3, int64 (E) x 2, int64 (n_in + 1), CUB radix-sort scratch.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/common/geometry.h"
#include "backend/cuda/common/compact.cuh"
#include "backend/cuda/common/coord_table.cuh"
#include "backend/cuda/common/float16.cuh"
#include "backend/cuda/common/group_by_key.cuh"
#include "backend/cuda/pool/pool_routes.h"
#include "backend/cuda/runtime/check.h"
#include "backend/cuda/runtime/memory.h"
#include "backend/cuda/runtime/stream.h"
#include "backend/kernels.h"
#include "lattice/core/error.h"

namespace lattice::backend::cuda {
namespace {

__device__ inline float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ inline double add_rn(double a, double b) { return __dadd_rn(a, b); }
__device__ inline float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ inline double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ inline float div_rn(float a, float b) { return __fdiv_rn(a, b); }
__device__ inline double div_rn(double a, double b) { return __ddiv_rn(a, b); }

// The max rule of cpu/pool/pool_routes.h (pool_detail::max_beats), on the device.
template <class A>
__device__ inline bool max_beats(A v, std::int32_t i, A best, std::int32_t best_i) {
  if (v > best) return true;
  if (v == best) return i < best_i;
  if (v != v) return best == best || i < best_i;
  return false;
}

#define LATTICE_GRID_STRIDE(i, n)                                                             \
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; \
       i < (n); i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)

template <class T>
__global__ void forward_kernel(PoolMode mode, std::int64_t n_out, std::int64_t C,
                               const std::int64_t* __restrict__ out_ptr,
                               const std::int32_t* __restrict__ in_idx,
                               const double* __restrict__ weights, const T* __restrict__ x,
                               T* __restrict__ y, std::int32_t* __restrict__ argmax) {
  using A = Accum<T>;
  LATTICE_GRID_STRIDE(t, n_out * C) {
    const std::int64_t o = t / C, c = t - o * C;
    const std::int64_t begin = out_ptr[o], end = out_ptr[o + 1];
    if (mode == PoolMode::max) {
      std::int32_t best_i = -1;
      A best = A(0);
      for (std::int64_t e = begin; e < end; ++e) {
        const std::int32_t i = in_idx[e];
        const A v = dev_load(x[std::int64_t{i} * C + c]);
        if (best_i < 0 || max_beats(v, i, best, best_i)) {
          best = v;
          best_i = i;
        }
      }
      y[t] = best_i < 0 ? dev_store<T>(A(0)) : x[std::int64_t{best_i} * C + c];
      argmax[t] = best_i;
      continue;
    }
    A acc = A(0);
    if (mode == PoolMode::weighted) {
      for (std::int64_t e = begin; e < end; ++e)
        acc = add_rn(acc, mul_rn(static_cast<A>(weights[e]),
                                 dev_load(x[std::int64_t{in_idx[e]} * C + c])));
    } else {
      for (std::int64_t e = begin; e < end; ++e)
        acc = add_rn(acc, dev_load(x[std::int64_t{in_idx[e]} * C + c]));
    }
    if (mode == PoolMode::avg && end > begin) acc = div_rn(acc, static_cast<A>(end - begin));
    y[t] = dev_store<T>(acc);
  }
}

// edge_out[e] = the output row of edge e.
__global__ void edge_rows_kernel(std::int64_t n_out, const std::int64_t* __restrict__ out_ptr,
                                 std::int32_t* __restrict__ edge_out) {
  LATTICE_GRID_STRIDE(o, n_out) {
    for (std::int64_t e = out_ptr[o]; e < out_ptr[o + 1]; ++e)
      edge_out[e] = static_cast<std::int32_t>(o);
  }
}

// dx[i, c] = 0 + sum over the edges (i, o) of i, o ascending, of the mode's term.
template <class T>
__global__ void input_grad_kernel(PoolMode mode, std::int64_t n_in, std::int64_t C,
                                  const std::int64_t* __restrict__ out_ptr,
                                  const std::int64_t* __restrict__ in_ptr,
                                  const std::int64_t* __restrict__ order,
                                  const std::int32_t* __restrict__ edge_out,
                                  const double* __restrict__ weights,
                                  const std::int32_t* __restrict__ argmax, const T* __restrict__ dy,
                                  T* __restrict__ dx) {
  using A = Accum<T>;
  LATTICE_GRID_STRIDE(t, n_in * C) {
    const std::int64_t i = t / C, c = t - i * C;
    A acc = A(0);
    for (std::int64_t p = in_ptr[i]; p < in_ptr[i + 1]; ++p) {
      const std::int64_t e = order[p];
      const std::int64_t o = edge_out[e];
      const std::int64_t oc = o * C + c;
      switch (mode) {
        case PoolMode::sum:
          acc = add_rn(acc, dev_load(dy[oc]));
          break;
        case PoolMode::avg:
          acc = add_rn(acc, div_rn(dev_load(dy[oc]), static_cast<A>(out_ptr[o + 1] - out_ptr[o])));
          break;
        case PoolMode::weighted:
          acc = add_rn(acc, mul_rn(static_cast<A>(weights[e]), dev_load(dy[oc])));
          break;
        case PoolMode::max:
          if (argmax[oc] == i) acc = add_rn(acc, dev_load(dy[oc]));
          break;
      }
    }
    dx[t] = dev_store<T>(acc);
  }
}

template <class T>
void run_forward(const PoolArgs& a) {
  if (a.n_out * a.channels == 0) return;
  cudaStream_t s = stream_of(a.device);
  forward_kernel<T><<<route_grid(a.n_out * a.channels), kRouteThreads, 0, s>>>(
      a.mode, a.n_out, a.channels, a.out_ptr, a.in_idx, a.weights, static_cast<const T*>(a.x),
      static_cast<T*>(a.y), a.argmax);
  LATTICE_CUDA_CHECK_LAUNCH();
}

template <class T>
void run_input_grad(const PoolArgs& a) {
  const std::int64_t C = a.channels, E = a.n_edges;
  if (a.n_in * C == 0) return;
  cudaStream_t s = stream_of(a.device);
  if (E == 0) {
    LATTICE_CUDA_CHECK(cudaMemsetAsync(a.dx, 0, static_cast<std::size_t>(a.n_in * C) * size_of(a.dtype), s));
    return;
  }
  // Input-major copy of the edges: edge ids sorted stably by input row.
  Array edge_out = Array::empty({E}, Dtype::i32, a.device);
  Array keys = Array::empty({E}, Dtype::i32, a.device);
  Array ids = Array::empty({E}, Dtype::i64, a.device);
  Array order = Array::empty({E}, Dtype::i64, a.device);
  Array in_ptr = Array::empty({a.n_in + 1}, Dtype::i64, a.device);
  edge_rows_kernel<<<route_grid(a.n_out), kRouteThreads, 0, s>>>(a.n_out, a.out_ptr,
                                                                 edge_out.data<std::int32_t>());
  LATTICE_CUDA_CHECK_LAUNCH();
  fill_iota(ids.data<std::int64_t>(), E, a.device);
  auto* sorted_keys = reinterpret_cast<std::uint32_t*>(keys.data<std::int32_t>());
  stable_sort_pairs(reinterpret_cast<const std::uint32_t*>(a.in_idx), sorted_keys,
                    ids.data<std::int64_t>(), order.data<std::int64_t>(), E,
                    key_bits(a.n_in > 0 ? a.n_in - 1 : 0), a.device);
  csr_from_sorted_keys(sorted_keys, E, a.n_in, in_ptr.data<std::int64_t>(), a.device);
  input_grad_kernel<T><<<route_grid(a.n_in * C), kRouteThreads, 0, s>>>(
      a.mode, a.n_in, C, a.out_ptr, in_ptr.data<std::int64_t>(), order.data<std::int64_t>(),
      edge_out.data<std::int32_t>(), a.weights, a.argmax, static_cast<const T*>(a.dy),
      static_cast<T*>(a.dx));
  LATTICE_CUDA_CHECK_LAUNCH();
}

void check(const PoolArgs& a, bool forward_pass) {
  LATTICE_ASSERT(a.device.is_cuda(), "pool cuda_csr_reduce: arrays are not on a cuda device");
  LATTICE_ASSERT(a.out_ptr != nullptr, "pool cuda_csr_reduce: out_ptr is null");
  LATTICE_ASSERT(a.n_edges == 0 || a.in_idx != nullptr, "pool cuda_csr_reduce: in_idx is null");
  LATTICE_ASSERT(a.mode != PoolMode::weighted || a.n_edges == 0 || a.weights != nullptr,
                 "pool cuda_csr_reduce: weights are null");
  LATTICE_ASSERT(a.mode != PoolMode::max || a.argmax != nullptr || a.n_out * a.channels == 0,
                 "pool cuda_csr_reduce: argmax is null");
  LATTICE_ASSERT(
      forward_pass ? (a.x || a.n_in * a.channels == 0) : (a.dy || a.n_out * a.channels == 0),
      "pool cuda_csr_reduce: input features are null");
  LATTICE_ASSERT(a.n_in <= geometry::kInt32Max, "pool cuda_csr_reduce: more than 2^31 input rows");
}

// ---- global pooling edges ------------------------------------------------------------------

struct BatchScan {
  unsigned long long negative_row;  // smallest row with a negative batch id (~0: none)
  int max_id;                       // largest batch id (-1: no rows)
};

__global__ void batch_keys_kernel(std::int64_t n, const std::int32_t* __restrict__ coords,
                                  std::uint32_t* __restrict__ keys, BatchScan* scan) {
  LATTICE_GRID_STRIDE(r, n) {
    const std::int32_t b = coords[4 * r];
    keys[r] = static_cast<std::uint32_t>(b);
    if (b < 0)
      atomicMin(&scan->negative_row, static_cast<unsigned long long>(r));
    else
      atomicMax(&scan->max_id, b);
  }
}

__global__ void first_empty_kernel(std::int64_t groups, const std::int64_t* __restrict__ ptr,
                                   unsigned long long* first) {
  LATTICE_GRID_STRIDE(g, groups) {
    if (ptr[g + 1] == ptr[g]) atomicMin(first, static_cast<unsigned long long>(g));
  }
}

__global__ void set_last_kernel(std::int64_t* ptr, std::int64_t index, std::int64_t value) {
  ptr[index] = value;
}

// ---- trilinear edges -----------------------------------------------------------------------

// Candidates of fine row o (the rule of ops/pool.cpp plan_trilinear_upsample): up to 8 coarse
// rows with normalised weights, compacted to the front of the row's 8 slots.
__global__ void trilinear_candidates_kernel(std::int64_t n_fine, const Coord4* __restrict__ fine,
                                            CoordTableView coarse, Int3 ratio,
                                            std::int32_t* __restrict__ cand,
                                            double* __restrict__ cand_w,
                                            std::int64_t* __restrict__ counts) {
  LATTICE_GRID_STRIDE(o, n_fine) {
    const Coord4 f = fine[o];
    const std::int32_t fc[3] = {f.x, f.y, f.z};
    std::int64_t lo[3], w[3][2];
    for (int a = 0; a < 3; ++a) {
      const std::int64_t r = ratio[a], num = 2 * std::int64_t{fc[a]} + 1 - r, den = 2 * r;
      lo[a] = geometry::floor_div(num, den);
      const std::int64_t m = num - lo[a] * den;
      w[a][0] = den - m;
      w[a][1] = m;
    }
    int found = 0;
    double total = 0;
    for (int corner = 0; corner < 8; ++corner) {
      const int d[3] = {(corner >> 2) & 1, (corner >> 1) & 1, corner & 1};
      const double wc = __dmul_rn(__dmul_rn(static_cast<double>(w[0][d[0]]),
                                            static_cast<double>(w[1][d[1]])),
                                  static_cast<double>(w[2][d[2]]));
      if (wc == 0) continue;
      std::int64_t c[3];
      bool fits = true;
      for (int a = 0; a < 3; ++a) {
        c[a] = lo[a] + d[a];
        fits = fits && geometry::fits_int32(c[a]);
      }
      if (!fits) continue;
      const std::int32_t i = table_find(
          coarse, Coord4{f.b, static_cast<std::int32_t>(c[0]), static_cast<std::int32_t>(c[1]),
                         static_cast<std::int32_t>(c[2])});
      if (i < 0) continue;
      cand[o * 8 + found] = i;
      cand_w[o * 8 + found] = wc;
      total = __dadd_rn(total, wc);
      ++found;
    }
    for (int k = 0; k < found; ++k) cand_w[o * 8 + k] = __ddiv_rn(cand_w[o * 8 + k], total);
    counts[o] = found;
  }
}

__global__ void trilinear_fill_kernel(std::int64_t n_fine, const std::int64_t* __restrict__ ptr,
                                      const std::int32_t* __restrict__ cand,
                                      const double* __restrict__ cand_w,
                                      std::int32_t* __restrict__ in_idx,
                                      double* __restrict__ weights) {
  LATTICE_GRID_STRIDE(o, n_fine) {
    const std::int64_t begin = ptr[o], count = ptr[o + 1] - begin;
    for (std::int64_t k = 0; k < count; ++k) {
      in_idx[begin + k] = cand[o * 8 + k];
      weights[begin + k] = cand_w[o * 8 + k];
    }
  }
}

}  // namespace

void pool_csr_reduce_forward(const PoolArgs& args) {
  check(args, true);
  DeviceGuard guard(args.device.index);
  dispatch_float(args.dtype, "pool_cuda_csr_reduce_forward", "dtype",
                 [&](auto tag) { run_forward<typename decltype(tag)::type>(args); });
}

void pool_csr_reduce_input_grad(const PoolArgs& args) {
  check(args, false);
  DeviceGuard guard(args.device.index);
  dispatch_float(args.dtype, "pool_cuda_csr_reduce_input_grad", "dtype",
                 [&](auto tag) { run_input_grad<typename decltype(tag)::type>(args); });
}

PoolEdgeList pool_batch_edges(const BatchEdgesArgs& a) {
  LATTICE_ASSERT(a.device.is_cuda(), "pool_batch_edges: coordinates are not on a cuda device");
  LATTICE_ASSERT(a.n <= geometry::kInt32Max, "pool_batch_edges: more than 2^31 rows");
  DeviceGuard guard(a.device.index);
  cudaStream_t s = stream_of(a.device);
  PoolEdgeList out;
  const std::int64_t n = a.n;
  Array keys = Array::empty({n}, Dtype::i32, a.device);
  std::int64_t batches = a.batches;
  if (n > 0) {
    Array scan = Array::empty({static_cast<std::int64_t>(sizeof(BatchScan))}, Dtype::u8, a.device);
    const BatchScan init{~0ULL, -1};
    LATTICE_CUDA_CHECK(cudaMemcpyAsync(scan.raw_data(), &init, sizeof init, cudaMemcpyHostToDevice, s));
    batch_keys_kernel<<<route_grid(n), kRouteThreads, 0, s>>>(
        n, a.coords, reinterpret_cast<std::uint32_t*>(keys.data<std::int32_t>()),
        static_cast<BatchScan*>(scan.raw_data()));
    LATTICE_CUDA_CHECK_LAUNCH();
    BatchScan got{};
    copy_to_host(&got, scan.raw_data(), sizeof got, a.device);
    if (got.negative_row != ~0ULL) {
      out.negative_row = static_cast<std::int64_t>(got.negative_row);
      copy_to_host(&out.negative_batch, a.coords + 4 * out.negative_row, sizeof(std::int32_t), a.device);
      return out;
    }
    if (batches < 0) batches = std::int64_t{got.max_id} + 1;
  } else if (batches < 0) {
    batches = 0;
  }
  out.out_ptr = Array::empty({batches + 1}, Dtype::i64, a.device);
  out.in_idx = Array::empty({n}, Dtype::i32, a.device);
  if (n == 0) {
    LATTICE_CUDA_CHECK(cudaMemsetAsync(out.out_ptr.raw_data(), 0, out.out_ptr.nbytes(), s));
  } else {
    Array rows = Array::empty({n}, Dtype::i32, a.device);
    Array sorted = Array::empty({n}, Dtype::i32, a.device);
    fill_iota(rows.data<std::int32_t>(), n, a.device);
    auto* sorted_keys = reinterpret_cast<std::uint32_t*>(sorted.data<std::int32_t>());
    stable_sort_pairs(reinterpret_cast<const std::uint32_t*>(keys.data<std::int32_t>()), sorted_keys,
                      rows.data<std::int32_t>(), out.in_idx.data<std::int32_t>(), n,
                      key_bits(batches > 0 ? batches - 1 : 0), a.device);
    csr_from_sorted_keys(sorted_keys, n, batches, out.out_ptr.data<std::int64_t>(), a.device);
  }
  if (batches > 0) {
    Array first = Array::empty({1}, Dtype::i64, a.device);
    LATTICE_CUDA_CHECK(cudaMemsetAsync(first.raw_data(), 0xff, sizeof(std::int64_t), s));
    first_empty_kernel<<<route_grid(batches), kRouteThreads, 0, s>>>(
        batches, out.out_ptr.data<std::int64_t>(), reinterpret_cast<unsigned long long*>(first.raw_data()));
    LATTICE_CUDA_CHECK_LAUNCH();
    unsigned long long g = ~0ULL;
    copy_to_host(&g, first.raw_data(), sizeof g, a.device);
    if (g != ~0ULL) out.first_empty = static_cast<std::int64_t>(g);
  }
  return out;
}

PoolEdgeList pool_trilinear_edges(const TrilinearEdgesArgs& a) {
  LATTICE_ASSERT(a.device.is_cuda(), "pool_trilinear_edges: coordinates are not on a cuda device");
  DeviceGuard guard(a.device.index);
  cudaStream_t s = stream_of(a.device);
  PoolEdgeList out;
  const std::int64_t n = a.n_fine;
  out.out_ptr = Array::empty({n + 1}, Dtype::i64, a.device);
  if (n == 0) {
    LATTICE_CUDA_CHECK(cudaMemsetAsync(out.out_ptr.raw_data(), 0, out.out_ptr.nbytes(), s));
    out.in_idx = Array::empty({0}, Dtype::i32, a.device);
    out.weights = Array::empty({0}, Dtype::f64, a.device);
    return out;
  }
  CoordTable table;
  CoordTableView view;
  if (a.coarse_slots) {  // the coarse set's cached index
    view = {reinterpret_cast<const Coord4*>(a.coarse), const_cast<std::int32_t*>(a.coarse_slots),
            a.coarse_mask};
  } else {
    table = build_coord_table(reinterpret_cast<const Coord4*>(a.coarse), a.n_coarse, a.device);
    view = table.view();
  }
  Array cand = Array::empty({n, 8}, Dtype::i32, a.device);
  Array cand_w = Array::empty({n, 8}, Dtype::f64, a.device);
  Array counts = Array::empty({n}, Dtype::i64, a.device);
  trilinear_candidates_kernel<<<route_grid(n), kRouteThreads, 0, s>>>(
      n, reinterpret_cast<const Coord4*>(a.fine), view, a.ratio, cand.data<std::int32_t>(),
      cand_w.data<double>(), counts.data<std::int64_t>());
  LATTICE_CUDA_CHECK_LAUNCH();
  std::int64_t* ptr = out.out_ptr.data<std::int64_t>();
  const std::int64_t total = exclusive_count(counts.data<std::int64_t>(), ptr, n, a.device);
  set_last_kernel<<<1, 1, 0, s>>>(ptr, n, total);
  LATTICE_CUDA_CHECK_LAUNCH();
  out.in_idx = Array::empty({total}, Dtype::i32, a.device);
  out.weights = Array::empty({total}, Dtype::f64, a.device);
  if (total > 0) {
    trilinear_fill_kernel<<<route_grid(n), kRouteThreads, 0, s>>>(
        n, ptr, cand.data<std::int32_t>(), cand_w.data<double>(), out.in_idx.data<std::int32_t>(),
        out.weights.data<double>());
    LATTICE_CUDA_CHECK_LAUNCH();
  }
  return out;
}

}  // namespace lattice::backend::cuda

LATTICE_ROUTE_KERNELS(PoolKernels, pool_cuda_csr_reduce, {
    .forward = cuda::pool_csr_reduce_forward,
    .input_grad = cuda::pool_csr_reduce_input_grad});
