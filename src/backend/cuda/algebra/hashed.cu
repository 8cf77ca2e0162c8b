// Constraints: CUDA (data on a cuda device, the CUDA backend built and a device present); align
// and lookup on any int32 coordinate rows, unique within each set (checked here on the device,
// raising the CPU index's ValueError), fewer than 2^30 rows in every set that is hashed (both
// sets of an alignment, the table of a lookup; queries any count); combine passes on float
// dtypes (f16, bf16, f32, f64); any row count, including none. Deterministic: bitwise-identical
// results run to run, equal to the CPU reference route (no float atomics).
//
// Alignment hashes each set into a device coordinate table (backend/cuda/common/coord_table.cuh,
// full 128-bit rows, so probes never alias), one probe per row. Joins that drop rows (inner, and
// the rhs-only tail of outer) are compacted by flag / exclusive prefix sum (CUB) / scatter, which
// keeps the input order: inner = lhs rows found in rhs in lhs order; outer = lhs rows, then the
// rhs-only rows in rhs order (SEMANTICS.md "Sparse algebra"). One host synchronisation per
// compaction (to size the output) and per duplicate check.
// The combine passes run one thread per output element with the arithmetic of
// src/backend/cpu/algebra/combine.h (f16/bf16 via f32, rounded once with the CPU's exact
// conversions, backend/cuda/common/float16.cuh); in the backward pass each input row occurs at
// most once in an alignment, so gradient elements are written without races or atomics.
//
// Shapes: lhs (n_lhs, 4), rhs (n_rhs, 4), queries (Q, 4) int32; row maps (M) int64; features
// lhs (n_lhs, C_lhs), rhs (n_rhs, C_rhs), out / dout (M, C_out) of the storage dtype T.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "backend/cuda/common/compact.cuh"
#include "backend/cuda/common/coord_table.cuh"
#include "backend/cuda/common/float16.cuh"
#include "backend/cuda/runtime/check.h"
#include "backend/cuda/runtime/memory.h"
#include "backend/cuda/runtime/stream.h"
#include "backend/kernels.h"
#include "lattice/core/error.h"

namespace lattice::backend::cuda {
namespace {

using geometry::Coord4;

const Coord4* as_rows(const std::int32_t* p) { return reinterpret_cast<const Coord4*>(p); }

__device__ inline std::int64_t thread_index() {
  return blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
}
__device__ inline std::int64_t thread_stride() { return static_cast<std::int64_t>(gridDim.x) * blockDim.x; }

// ---- alignment and lookup ----------------------------------------------------------------------

// found[i] = row of q[i] in the table, or -1.
__global__ void probe_kernel(CoordTableView t, const Coord4* q, std::int64_t n, std::int64_t* found) {
  for (std::int64_t i = thread_index(); i < n; i += thread_stride()) found[i] = table_find(t, q[i]);
}

__global__ void iota_kernel(std::int64_t* rows, std::int64_t n) {
  for (std::int64_t i = thread_index(); i < n; i += thread_stride()) rows[i] = i;
}

// flags[i] = 1 when (found[i] >= 0) == keep_found.
__global__ void flag_kernel(const std::int64_t* found, std::int64_t n, bool keep_found, std::int32_t* flags) {
  for (std::int64_t i = thread_index(); i < n; i += thread_stride())
    flags[i] = ((found[i] >= 0) == keep_found) ? 1 : 0;
}

// Inner join: the flagged lhs rows i, in order, with their rhs rows.
__global__ void scatter_inner(const std::int64_t* found, const std::int32_t* flags, const std::int32_t* pos,
                              std::int64_t n, std::int64_t* l, std::int64_t* r) {
  for (std::int64_t i = thread_index(); i < n; i += thread_stride()) {
    if (!flags[i]) continue;
    l[pos[i]] = i;
    r[pos[i]] = found[i];
  }
}

// Outer join tail: the flagged (rhs-only) rows j, in order, with no lhs row.
__global__ void scatter_tail(const std::int32_t* flags, const std::int32_t* pos, std::int64_t n,
                             std::int64_t* l, std::int64_t* r) {
  for (std::int64_t j = thread_index(); j < n; j += thread_stride()) {
    if (!flags[j]) continue;
    l[pos[j]] = -1;
    r[pos[j]] = j;
  }
}

__global__ void gather_coords(const std::int64_t* l, const std::int64_t* r, const Coord4* lhs,
                              const Coord4* rhs, std::int64_t m, Coord4* out) {
  for (std::int64_t k = thread_index(); k < m; k += thread_stride()) out[k] = l[k] >= 0 ? lhs[l[k]] : rhs[r[k]];
}

void launch_probe(const CoordTable& table, const std::int32_t* queries, std::int64_t n, std::int64_t* found,
                  cudaStream_t s) {
  if (n == 0) return;
  probe_kernel<<<route_grid(n), kRouteThreads, 0, s>>>(table.view(), as_rows(queries), n, found);
  LATTICE_CUDA_CHECK_LAUNCH();
}

void launch_iota(std::int64_t* rows, std::int64_t n, cudaStream_t s) {
  if (n == 0) return;
  iota_kernel<<<route_grid(n), kRouteThreads, 0, s>>>(rows, n);
  LATTICE_CUDA_CHECK_LAUNCH();
}

// The table over `rows` (n rows on `device`); raises the CPU index's ValueError
// ("[op] coords: expected unique rows, got row 7 (0, 1, 2, 3) equal to row 2") on repeated rows.
CoordTable unique_table(const std::int32_t* rows, std::int64_t n, Device device, std::string_view op) {
  CoordTable table = build_coord_table(as_rows(rows), n, device);
  const DuplicatePair dup = find_duplicate(table, device);
  if (dup.row >= 0) {
    std::int32_t c[4] = {0, 0, 0, 0};
    copy_to_host(c, rows + 4 * dup.row, sizeof c, device);
    std::string got = "row ";
    got += std::to_string(dup.row);
    got += " (";
    for (int k = 0; k < 4; ++k) {
      if (k > 0) got += ", ";
      got += std::to_string(c[k]);
    }
    got += ") equal to row ";
    got += std::to_string(dup.first);
    throw_value_error(op, "coords", "unique rows", got);
  }
  return table;
}

// ---- combine -------------------------------------------------------------------------------------

__device__ inline std::int64_t row_of(const std::int64_t* rows, std::int64_t m) { return rows ? rows[m] : m; }

template <class A>
__device__ inline bool chooses_lhs(AlgebraOp op, A a, A b) {
  if (op == AlgebraOp::maximum) return a >= b || isnan(a);
  return a <= b || isnan(a);  // minimum
}

// NaN results with the bits the CPU routes produce (x86-64 SSE/AVX arithmetic, which the CPU
// reference follows): a NaN operand propagates quieted, the lhs one when both are NaN (checked on
// the CPU build: the compiled a + b, a - b, a * b keep lhs's payload), and a NaN
// made from non-NaN operands (inf - inf, 0 * inf) is the x86 default NaN, which has the sign
// bit set. GPU arithmetic instead returns one canonical NaN (0x7fffffff for f32), so without this
// every NaN would differ bitwise from the CPU (found on the H200: only add/sub/mul outputs and
// the sub/mul gradients differed, and only at NaN elements). Negation flips the sign bit as the
// CPU's -x does (the GPU's negation may canonicalise NaN too).
__device__ inline float quiet_nan(float x) { return __int_as_float(__float_as_int(x) | 0x00400000); }
__device__ inline double quiet_nan(double x) {
  return __longlong_as_double(__double_as_longlong(x) | 0x0008000000000000LL);
}
__device__ inline float default_nan(float) { return __int_as_float(static_cast<int>(0xffc00000u)); }
__device__ inline double default_nan(double) {
  return __longlong_as_double(static_cast<long long>(0xfff8000000000000ull));
}
__device__ inline float negate(float x) { return __int_as_float(__float_as_int(x) ^ static_cast<int>(0x80000000u)); }
__device__ inline double negate(double x) {
  return __longlong_as_double(__double_as_longlong(x) ^ static_cast<long long>(0x8000000000000000ull));
}

// r = a (op) b for add / sub / mul, with the CPU's NaN bits (a NaN result needs a NaN operand or
// an invalid operation; a non-NaN r is returned unchanged).
template <class A>
__device__ inline A cpu_nan(A a, A b, A r) {
  if (!isnan(r)) return r;
  if (isnan(a)) return quiet_nan(a);
  if (isnan(b)) return quiet_nan(b);
  return default_nan(r);
}

template <class A>
__device__ inline A apply(AlgebraOp op, A a, A b) {
  switch (op) {
    case AlgebraOp::add: return cpu_nan(a, b, a + b);
    case AlgebraOp::sub: return cpu_nan(a, b, a - b);
    case AlgebraOp::mul: return cpu_nan(a, b, a * b);
    case AlgebraOp::maximum:
    case AlgebraOp::minimum: return chooses_lhs(op, a, b) ? a : b;
    default: return A{0};
  }
}

// Plain-value copy of the CombineArgs fields the kernels read.
struct CombineView {
  AlgebraOp op;
  std::int64_t n_out, c_lhs, c_rhs;
  const std::int64_t* lhs_rows;
  const std::int64_t* rhs_rows;
};

CombineView view_of(const CombineArgs& a) {
  return {a.op, a.n_out, a.c_lhs, a.c_rhs, a.lhs_rows, a.rhs_rows};
}

// One thread per output element (m, c).
template <class T>
__global__ void forward_kernel(CombineView v, const T* lhs, const T* rhs, T* out, Accum<T> fill, T fill_t) {
  const bool cat = v.op == AlgebraOp::cat;
  const std::int64_t c_out = cat ? v.c_lhs + v.c_rhs : v.c_lhs;
  const std::int64_t total = v.n_out * c_out;
  for (std::int64_t e = thread_index(); e < total; e += thread_stride()) {
    const std::int64_t m = e / c_out, c = e - m * c_out;
    const std::int64_t li = row_of(v.lhs_rows, m);
    const std::int64_t ri = row_of(v.rhs_rows, m);
    if (cat) {
      if (c < v.c_lhs)
        out[e] = li >= 0 ? lhs[li * v.c_lhs + c] : fill_t;
      else
        out[e] = ri >= 0 ? rhs[ri * v.c_rhs + (c - v.c_lhs)] : fill_t;
      continue;
    }
    const Accum<T> a = li >= 0 ? dev_load(lhs[li * c_out + c]) : fill;
    const Accum<T> b = ri >= 0 ? dev_load(rhs[ri * c_out + c]) : fill;
    out[e] = dev_store<T>(apply(v.op, a, b));
  }
}

// One thread per output element; gradient buffers were zeroed before.
template <class T>
__global__ void backward_kernel(CombineView v, const T* lhs, const T* rhs, const T* dout, T* dlhs, T* drhs,
                                Accum<T> fill) {
  using A = Accum<T>;
  const bool cat = v.op == AlgebraOp::cat;
  const std::int64_t c_out = cat ? v.c_lhs + v.c_rhs : v.c_lhs;
  const std::int64_t total = v.n_out * c_out;
  for (std::int64_t e = thread_index(); e < total; e += thread_stride()) {
    const std::int64_t m = e / c_out, c = e - m * c_out;
    const std::int64_t li = row_of(v.lhs_rows, m);
    const std::int64_t ri = row_of(v.rhs_rows, m);
    if (cat) {
      if (c < v.c_lhs) {
        if (dlhs && li >= 0) dlhs[li * v.c_lhs + c] = dout[e];
      } else {
        if (drhs && ri >= 0) drhs[ri * v.c_rhs + (c - v.c_lhs)] = dout[e];
      }
      continue;
    }
    T* dl = (dlhs && li >= 0) ? dlhs + li * c_out : nullptr;
    T* dr = (drhs && ri >= 0) ? drhs + ri * c_out : nullptr;
    if (!dl && !dr) continue;
    const A gv = dev_load(dout[e]);
    A ga{0}, gb{0};
    switch (v.op) {
      case AlgebraOp::add:
        ga = gv;
        gb = gv;
        break;
      case AlgebraOp::sub:
        ga = gv;
        gb = negate(gv);
        break;
      case AlgebraOp::mul:
      case AlgebraOp::maximum:
      case AlgebraOp::minimum: {
        const A va = li >= 0 ? dev_load(lhs[li * c_out + c]) : fill;
        const A vb = ri >= 0 ? dev_load(rhs[ri * c_out + c]) : fill;
        if (v.op == AlgebraOp::mul) {
          // Operand order of the two NaN case as the CPU build computes it (checked: dlhs keeps
          // the gradient's payload, drhs the lhs value's).
          ga = cpu_nan(gv, vb, gv * vb);
          gb = cpu_nan(va, gv, gv * va);
        } else if (chooses_lhs(v.op, va, vb)) {
          ga = gv;
        } else {
          gb = gv;
        }
        break;
      }
      default:
        break;
    }
    if (dl) dl[c] = dev_store<T>(ga);
    if (dr) dr[c] = dev_store<T>(gb);
  }
}

// The fill rounded to the storage dtype (it is an input value), as the CPU routes do.
template <class T>
Accum<T> rounded_fill(double fill) {
  return load(store<T>(static_cast<Accum<T>>(fill)));
}

template <class T>
void forward_typed(const CombineArgs& a) {
  const std::int64_t c_out = a.op == AlgebraOp::cat ? a.c_lhs + a.c_rhs : a.c_lhs;
  const std::int64_t total = a.n_out * c_out;
  if (total == 0) return;
  const Accum<T> fill = rounded_fill<T>(a.fill);
  cudaStream_t s = stream_of(a.device);
  forward_kernel<T><<<route_grid(total), kRouteThreads, 0, s>>>(
      view_of(a), static_cast<const T*>(a.lhs), static_cast<const T*>(a.rhs), static_cast<T*>(a.out), fill,
      store<T>(fill));
  LATTICE_CUDA_CHECK_LAUNCH();
}

template <class T>
void backward_typed(const CombineArgs& a) {
  cudaStream_t s = stream_of(a.device);
  if (a.dlhs && a.n_lhs * a.c_lhs > 0)
    LATTICE_CUDA_CHECK(cudaMemsetAsync(a.dlhs, 0, sizeof(T) * a.n_lhs * a.c_lhs, s));
  if (a.drhs && a.n_rhs * a.c_rhs > 0)
    LATTICE_CUDA_CHECK(cudaMemsetAsync(a.drhs, 0, sizeof(T) * a.n_rhs * a.c_rhs, s));
  const std::int64_t c_out = a.op == AlgebraOp::cat ? a.c_lhs + a.c_rhs : a.c_lhs;
  const std::int64_t total = a.n_out * c_out;
  if (total == 0 || (!a.dlhs && !a.drhs)) return;
  backward_kernel<T><<<route_grid(total), kRouteThreads, 0, s>>>(
      view_of(a), static_cast<const T*>(a.lhs), static_cast<const T*>(a.rhs), static_cast<const T*>(a.dout),
      static_cast<T*>(a.dlhs), static_cast<T*>(a.drhs), rounded_fill<T>(a.fill));
  LATTICE_CUDA_CHECK_LAUNCH();
}

template <template <class> class Fn>
void dispatch(const CombineArgs& a) {
  switch (a.dtype) {
    case Dtype::f16: return Fn<Half>::run(a);
    case Dtype::bf16: return Fn<BFloat16>::run(a);
    case Dtype::f32: return Fn<float>::run(a);
    case Dtype::f64: return Fn<double>::run(a);
    default: throw_unsupported_dtype("algebra", "feats", a.dtype, "float16, bfloat16, float32 or float64");
  }
}
template <class T>
struct Forward {
  static void run(const CombineArgs& a) { forward_typed<T>(a); }
};
template <class T>
struct Backward {
  static void run(const CombineArgs& a) { backward_typed<T>(a); }
};

}  // namespace

AlignResult algebra_cuda_hashed_align(const AlignArgs& a) {
  const Device device = a.device;
  DeviceGuard guard(device.index);
  cudaStream_t s = stream_of(device);
  // Both sets are checked for repeated rows (lhs first), as the CPU path does when it builds
  // both indexes.
  const CoordTable lhs_table = unique_table(a.lhs, a.n_lhs, device, a.op);
  const CoordTable rhs_table = unique_table(a.rhs, a.n_rhs, device, a.op);
  AlignResult out;
  std::int64_t m = 0;
  switch (a.join) {
    case Join::left: {
      m = a.n_lhs;
      out.lhs_rows = Array::empty({m}, Dtype::i64, device);
      out.rhs_rows = Array::empty({m}, Dtype::i64, device);
      launch_iota(out.lhs_rows.data<std::int64_t>(), m, s);
      launch_probe(rhs_table, a.lhs, a.n_lhs, out.rhs_rows.data<std::int64_t>(), s);
      break;
    }
    case Join::right: {
      m = a.n_rhs;
      out.lhs_rows = Array::empty({m}, Dtype::i64, device);
      out.rhs_rows = Array::empty({m}, Dtype::i64, device);
      launch_probe(lhs_table, a.rhs, a.n_rhs, out.lhs_rows.data<std::int64_t>(), s);
      launch_iota(out.rhs_rows.data<std::int64_t>(), m, s);
      break;
    }
    case Join::inner: {
      const std::int64_t n = a.n_lhs;
      Array found = Array::empty({n}, Dtype::i64, device);
      Array flags = Array::empty({n}, Dtype::i32, device);
      Array pos = Array::empty({n}, Dtype::i32, device);
      launch_probe(rhs_table, a.lhs, n, found.data<std::int64_t>(), s);
      if (n > 0) {
        flag_kernel<<<route_grid(n), kRouteThreads, 0, s>>>(found.data<std::int64_t>(), n, true,
                                                            flags.data<std::int32_t>());
        LATTICE_CUDA_CHECK_LAUNCH();
      }
      m = exclusive_count(flags.data<std::int32_t>(), pos.data<std::int32_t>(), n, device);
      out.lhs_rows = Array::empty({m}, Dtype::i64, device);
      out.rhs_rows = Array::empty({m}, Dtype::i64, device);
      if (m > 0) {
        scatter_inner<<<route_grid(n), kRouteThreads, 0, s>>>(
            found.data<std::int64_t>(), flags.data<std::int32_t>(), pos.data<std::int32_t>(), n,
            out.lhs_rows.data<std::int64_t>(), out.rhs_rows.data<std::int64_t>());
        LATTICE_CUDA_CHECK_LAUNCH();
      }
      break;
    }
    case Join::outer: {
      const std::int64_t n = a.n_rhs;
      Array in_lhs = Array::empty({n}, Dtype::i64, device);
      Array flags = Array::empty({n}, Dtype::i32, device);
      Array pos = Array::empty({n}, Dtype::i32, device);
      launch_probe(lhs_table, a.rhs, n, in_lhs.data<std::int64_t>(), s);
      if (n > 0) {
        flag_kernel<<<route_grid(n), kRouteThreads, 0, s>>>(in_lhs.data<std::int64_t>(), n, false,
                                                            flags.data<std::int32_t>());
        LATTICE_CUDA_CHECK_LAUNCH();
      }
      const std::int64_t tail = exclusive_count(flags.data<std::int32_t>(), pos.data<std::int32_t>(), n, device);
      m = a.n_lhs + tail;
      out.lhs_rows = Array::empty({m}, Dtype::i64, device);
      out.rhs_rows = Array::empty({m}, Dtype::i64, device);
      launch_iota(out.lhs_rows.data<std::int64_t>(), a.n_lhs, s);
      launch_probe(rhs_table, a.lhs, a.n_lhs, out.rhs_rows.data<std::int64_t>(), s);
      if (tail > 0) {
        scatter_tail<<<route_grid(n), kRouteThreads, 0, s>>>(
            flags.data<std::int32_t>(), pos.data<std::int32_t>(), n, out.lhs_rows.data<std::int64_t>() + a.n_lhs,
            out.rhs_rows.data<std::int64_t>() + a.n_lhs);
        LATTICE_CUDA_CHECK_LAUNCH();
      }
      break;
    }
  }
  out.coords = Array::empty({m, 4}, Dtype::i32, device);
  if (m > 0) {
    gather_coords<<<route_grid(m), kRouteThreads, 0, s>>>(
        out.lhs_rows.data<std::int64_t>(), out.rhs_rows.data<std::int64_t>(), as_rows(a.lhs), as_rows(a.rhs), m,
        reinterpret_cast<Coord4*>(out.coords.data<std::int32_t>()));
    LATTICE_CUDA_CHECK_LAUNCH();
  }
  return out;
}

void algebra_cuda_hashed_lookup(const LookupArgs& a) {
  DeviceGuard guard(a.device.index);
  const CoordTable table = unique_table(a.table, a.n_table, a.device, a.op);
  launch_probe(table, a.queries, a.n_queries, a.rows, stream_of(a.device));
}

void algebra_cuda_hashed_forward(const CombineArgs& a) {
  DeviceGuard guard(a.device.index);
  dispatch<Forward>(a);
}

void algebra_cuda_hashed_backward(const CombineArgs& a) {
  DeviceGuard guard(a.device.index);
  dispatch<Backward>(a);
}

}  // namespace lattice::backend::cuda

LATTICE_ROUTE_KERNELS(AlgebraKernels, algebra_cuda_hashed, {
    .align = cuda::algebra_cuda_hashed_align,
    .lookup = cuda::algebra_cuda_hashed_lookup,
    .forward = cuda::algebra_cuda_hashed_forward,
    .backward = cuda::algebra_cuda_hashed_backward});
