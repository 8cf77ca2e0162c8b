// The elementwise math of the algebra combine passes, shared by the CPU algebra routes so that
// every route computes bitwise the same values (they differ only in how rows are spread over
// threads). Private to src/backend/cpu/algebra.
//
// Output row m reads a = lhs[lhs_rows[m]] (or the fill when the map says -1) and
// b = rhs[rhs_rows[m]] (or the fill); a null map is the identity (row m). Per element:
//   add a + b        d/da = g      d/db = g
//   sub a - b        d/da = g      d/db = -g
//   mul a * b        d/da = g*b    d/db = g*a
//   maximum          a when (a >= b or a is NaN), else b; the gradient goes to the chosen side
//   minimum          a when (a <= b or a is NaN), else b;   (ties choose lhs)
//   cat              [a | b] along the feature axis; gradients are the two column slices
// A missing side is the fill constant: it gets no gradient. The fill is rounded to the storage
// dtype first (it is an input value); f16/bf16 arithmetic happens in f32, rounded once.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "backend/args.h"

namespace lattice::backend::cpu::algebra_detail {

inline std::int64_t row_of(const std::int64_t* rows, std::int64_t m) { return rows ? rows[m] : m; }

template <class A>
inline bool chooses_lhs(AlgebraOp op, A a, A b) {
  if (op == AlgebraOp::maximum) return a >= b || std::isnan(a);
  return a <= b || std::isnan(a);  // minimum
}

// The op as a template parameter, so the per-element loops below compile without a branch on it.
template <AlgebraOp Op, class A>
inline A apply(A a, A b) {
  if constexpr (Op == AlgebraOp::add) return a + b;
  if constexpr (Op == AlgebraOp::sub) return a - b;
  if constexpr (Op == AlgebraOp::mul) return a * b;
  if constexpr (Op == AlgebraOp::maximum || Op == AlgebraOp::minimum)
    return chooses_lhs(Op, a, b) ? a : b;
  return A{0};
}

template <class T>
inline Accum<T> rounded_fill(double fill) {
  return load(store<T>(static_cast<Accum<T>>(fill)));
}

// Binary op rows [m0, m1); both sides present is the common case and runs without the fill.
template <class T, AlgebraOp Op>
void binary_rows(const CombineArgs& a, std::int64_t m0, std::int64_t m1) {
  using A = Accum<T>;
  const auto* lhs = static_cast<const T*>(a.lhs);
  const auto* rhs = static_cast<const T*>(a.rhs);
  auto* out = static_cast<T*>(a.out);
  const A fill = rounded_fill<T>(a.fill);
  const std::int64_t c_n = a.c_lhs;
  for (std::int64_t m = m0; m < m1; ++m) {
    const std::int64_t li = row_of(a.lhs_rows, m);
    const std::int64_t ri = row_of(a.rhs_rows, m);
    T* o = out + m * c_n;
    if (li >= 0 && ri >= 0) {
      const T* x = lhs + li * c_n;
      const T* y = rhs + ri * c_n;
      for (std::int64_t c = 0; c < c_n; ++c) o[c] = store<T>(apply<Op>(load(x[c]), load(y[c])));
    } else {
      const T* x = li >= 0 ? lhs + li * c_n : nullptr;
      const T* y = ri >= 0 ? rhs + ri * c_n : nullptr;
      for (std::int64_t c = 0; c < c_n; ++c)
        o[c] = store<T>(apply<Op>(x ? load(x[c]) : fill, y ? load(y[c]) : fill));
    }
  }
}

// out rows [m0, m1).
template <class T>
void forward_rows(const CombineArgs& a, std::int64_t m0, std::int64_t m1) {
  using A = Accum<T>;
  const auto* lhs = static_cast<const T*>(a.lhs);
  const auto* rhs = static_cast<const T*>(a.rhs);
  auto* out = static_cast<T*>(a.out);
  const A fill = rounded_fill<T>(a.fill);
  if (a.op == AlgebraOp::cat) {
    const T fill_t = store<T>(fill);
    const std::int64_t c_out = a.c_lhs + a.c_rhs;
    for (std::int64_t m = m0; m < m1; ++m) {
      T* o = out + m * c_out;
      const std::int64_t li = row_of(a.lhs_rows, m);
      const std::int64_t ri = row_of(a.rhs_rows, m);
      for (std::int64_t c = 0; c < a.c_lhs; ++c) o[c] = li >= 0 ? lhs[li * a.c_lhs + c] : fill_t;
      for (std::int64_t c = 0; c < a.c_rhs; ++c)
        o[a.c_lhs + c] = ri >= 0 ? rhs[ri * a.c_rhs + c] : fill_t;
    }
    return;
  }
  switch (a.op) {
    case AlgebraOp::add:
      return binary_rows<T, AlgebraOp::add>(a, m0, m1);
    case AlgebraOp::sub:
      return binary_rows<T, AlgebraOp::sub>(a, m0, m1);
    case AlgebraOp::mul:
      return binary_rows<T, AlgebraOp::mul>(a, m0, m1);
    case AlgebraOp::maximum:
      return binary_rows<T, AlgebraOp::maximum>(a, m0, m1);
    case AlgebraOp::minimum:
      return binary_rows<T, AlgebraOp::minimum>(a, m0, m1);
    case AlgebraOp::cat:
      break;
  }
}

// Gradient rows [m0, m1): writes dlhs[lhs_rows[m]] and drhs[rhs_rows[m]] (each input row occurs
// at most once in an alignment, so ranges of m never write the same row). Rows absent from the
// output must have been zeroed by the caller.
template <class T>
void backward_rows(const CombineArgs& a, std::int64_t m0, std::int64_t m1) {
  using A = Accum<T>;
  const auto* lhs = static_cast<const T*>(a.lhs);
  const auto* rhs = static_cast<const T*>(a.rhs);
  const auto* dout = static_cast<const T*>(a.dout);
  auto* dlhs = static_cast<T*>(a.dlhs);
  auto* drhs = static_cast<T*>(a.drhs);
  if (a.op == AlgebraOp::cat) {
    const std::int64_t c_out = a.c_lhs + a.c_rhs;
    for (std::int64_t m = m0; m < m1; ++m) {
      const T* g = dout + m * c_out;
      const std::int64_t li = row_of(a.lhs_rows, m);
      const std::int64_t ri = row_of(a.rhs_rows, m);
      if (dlhs && li >= 0) std::memcpy(dlhs + li * a.c_lhs, g, sizeof(T) * a.c_lhs);
      if (drhs && ri >= 0) std::memcpy(drhs + ri * a.c_rhs, g + a.c_lhs, sizeof(T) * a.c_rhs);
    }
    return;
  }
  const A fill = rounded_fill<T>(a.fill);
  const std::int64_t c_n = a.c_lhs;
  const bool needs_values =
      a.op == AlgebraOp::mul || a.op == AlgebraOp::maximum || a.op == AlgebraOp::minimum;
  for (std::int64_t m = m0; m < m1; ++m) {
    const std::int64_t li = row_of(a.lhs_rows, m);
    const std::int64_t ri = row_of(a.rhs_rows, m);
    T* dl = (dlhs && li >= 0) ? dlhs + li * c_n : nullptr;
    T* dr = (drhs && ri >= 0) ? drhs + ri * c_n : nullptr;
    if (!dl && !dr) continue;
    const T* g = dout + m * c_n;
    const T* x = li >= 0 ? lhs + li * c_n : nullptr;
    const T* y = ri >= 0 ? rhs + ri * c_n : nullptr;
    for (std::int64_t c = 0; c < c_n; ++c) {
      const A gv = load(g[c]);
      A va{0}, vb{0};
      if (needs_values) {
        va = x ? load(x[c]) : fill;
        vb = y ? load(y[c]) : fill;
      }
      A ga{0}, gb{0};
      switch (a.op) {
        case AlgebraOp::add:
          ga = gv;
          gb = gv;
          break;
        case AlgebraOp::sub:
          ga = gv;
          gb = -gv;
          break;
        case AlgebraOp::mul:
          ga = gv * vb;
          gb = gv * va;
          break;
        case AlgebraOp::maximum:
        case AlgebraOp::minimum:
          if (chooses_lhs(a.op, va, vb))
            ga = gv;
          else
            gb = gv;
          break;
        case AlgebraOp::cat:
          break;
      }
      if (dl) dl[c] = store<T>(ga);
      if (dr) dr[c] = store<T>(gb);
    }
  }
}

}  // namespace lattice::backend::cpu::algebra_detail
