// Constraints: CPU; align and lookup on any int32 coordinate rows (unique within each set);
// combine passes on float dtypes (f16, bf16, f32, f64); any row count, including none.
// Deterministic (single-threaded, fixed order).
//
// The scalar reference route, written to be obviously correct rather than fast: each set is
// matched through a copy of its row numbers sorted by (batch, x, y, z) and binary search, so it
// does not depend on the coordinate index the fast route probes. Every other route is tested
// against it.
//
// Shapes: lhs (n_lhs, 4), rhs (n_rhs, 4), queries (Q, 4) int32; row maps (M) int64; features
// lhs (n_lhs, C_lhs), rhs (n_rhs, C_rhs), out / dout (M, C_out) of the storage dtype T.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "backend/cpu/algebra/combine.h"
#include "backend/kernels.h"

namespace lattice::backend::cpu {
namespace {

bool row_less(const std::int32_t* a, const std::int32_t* b) {
  return std::lexicographical_compare(a, a + 4, b, b + 4);
}

// Row numbers of `coords` sorted by coordinate value; find() by binary search.
class SortedRows {
 public:
  SortedRows(const std::int32_t* coords, std::int64_t n) : coords_(coords), order_(n) {
    std::iota(order_.begin(), order_.end(), std::int64_t{0});
    std::sort(order_.begin(), order_.end(), [&](std::int64_t a, std::int64_t b) {
      return row_less(coords_ + 4 * a, coords_ + 4 * b);
    });
  }
  // Row holding the value of `q` (4 ints), or -1.
  std::int64_t find(const std::int32_t* q) const {
    auto it = std::lower_bound(
        order_.begin(), order_.end(), q,
        [&](std::int64_t r, const std::int32_t* v) { return row_less(coords_ + 4 * r, v); });
    if (it == order_.end() || !std::equal(q, q + 4, coords_ + 4 * *it)) return -1;
    return *it;
  }

 private:
  const std::int32_t* coords_;
  std::vector<std::int64_t> order_;
};

}  // namespace

AlignResult algebra_reference_align(const AlignArgs& a) {
  std::vector<std::int64_t> l, r;
  switch (a.join) {
    case Join::left: {
      const SortedRows rhs(a.rhs, a.n_rhs);
      for (std::int64_t i = 0; i < a.n_lhs; ++i) {
        l.push_back(i);
        r.push_back(rhs.find(a.lhs + 4 * i));
      }
      break;
    }
    case Join::right: {
      const SortedRows lhs(a.lhs, a.n_lhs);
      for (std::int64_t j = 0; j < a.n_rhs; ++j) {
        l.push_back(lhs.find(a.rhs + 4 * j));
        r.push_back(j);
      }
      break;
    }
    case Join::inner: {
      const SortedRows rhs(a.rhs, a.n_rhs);
      for (std::int64_t i = 0; i < a.n_lhs; ++i) {
        const std::int64_t j = rhs.find(a.lhs + 4 * i);
        if (j < 0) continue;
        l.push_back(i);
        r.push_back(j);
      }
      break;
    }
    case Join::outer: {
      const SortedRows rhs(a.rhs, a.n_rhs);
      const SortedRows lhs(a.lhs, a.n_lhs);
      for (std::int64_t i = 0; i < a.n_lhs; ++i) {
        l.push_back(i);
        r.push_back(rhs.find(a.lhs + 4 * i));
      }
      for (std::int64_t j = 0; j < a.n_rhs; ++j) {
        if (lhs.find(a.rhs + 4 * j) >= 0) continue;
        l.push_back(-1);
        r.push_back(j);
      }
      break;
    }
  }
  AlignResult out;
  const auto m = static_cast<std::int64_t>(l.size());
  out.lhs_rows = Array::from_vector(l, {m});
  out.rhs_rows = Array::from_vector(r, {m});
  out.coords = Array::empty({m, 4}, Dtype::i32);
  auto* c = out.coords.data<std::int32_t>();
  for (std::int64_t k = 0; k < m; ++k) {
    const std::int32_t* src = l[k] >= 0 ? a.lhs + 4 * l[k] : a.rhs + 4 * r[k];
    std::memcpy(c + 4 * k, src, 4 * sizeof(std::int32_t));
  }
  return out;
}

void algebra_reference_lookup(const LookupArgs& a) {
  const SortedRows table(a.table, a.n_table);
  for (std::int64_t q = 0; q < a.n_queries; ++q) a.rows[q] = table.find(a.queries + 4 * q);
}

void algebra_reference_forward(const CombineArgs& a) {
  dispatch_float(a.dtype, "algebra", "feats", [&](auto tag) {
    using T = typename decltype(tag)::type;
    algebra_detail::forward_rows<T>(a, 0, a.n_out);
  });
}

void algebra_reference_backward(const CombineArgs& a) {
  dispatch_float(a.dtype, "algebra", "feats", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (a.dlhs) std::memset(a.dlhs, 0, sizeof(T) * a.n_lhs * a.c_lhs);
    if (a.drhs) std::memset(a.drhs, 0, sizeof(T) * a.n_rhs * a.c_rhs);
    algebra_detail::backward_rows<T>(a, 0, a.n_out);
  });
}

}  // namespace lattice::backend::cpu

LATTICE_ROUTE_KERNELS(AlgebraKernels, algebra_reference, {
    .align = cpu::algebra_reference_align,
    .lookup = cpu::algebra_reference_lookup,
    .forward = cpu::algebra_reference_forward,
    .backward = cpu::algebra_reference_backward});
