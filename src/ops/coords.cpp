// Coordinate utilities, semantic layer: set operations and lookups go through the algebra routes
// (alignment / lookup by value), downsampling and Morton codes through the coords routes.
#include "lattice/ops/coords.h"

#include <string>

#include "backend/kernel_table.h"
#include "lattice/core/error.h"
#include "lattice/ops/algebra.h"
#include "ops/common.h"
#include "tensor/coord_index.h"

namespace lattice::ops {

namespace {

std::int64_t find_in_index(const void* index, const geometry::Coord4& c) {
  return static_cast<const CoordIndex*>(index)->find(c);
}

// (N, cols) int32 CPU coordinates, cols one of the allowed widths.
void check_coords(std::string_view op, std::string_view arg, const Array& coords,
                  bool allow_three) {
  const std::string shape = allow_three ? "shape (N, 3) or (N, 4)" : "shape (N, 4)";
  if (!coords.defined()) throw_value_error(op, arg, "an int32 array of " + shape, "nothing");
  if (coords.dtype() != Dtype::i32)
    throw_type_error(op, arg, "int32 coordinates", std::string(to_string(coords.dtype())));
  if (!coords.device().is_cpu())
    throw_value_error(op, arg, "a CPU array", to_string(coords.device()));
  const bool ok = coords.ndim() == 2 && (coords.dim(1) == 4 || (allow_three && coords.dim(1) == 3));
  if (!ok) throw_value_error(op, arg, shape, format_shape(coords.shape()));
}

CoordsPass pass_of(std::string_view op) {
  if (op == "downsample_coords") return CoordsPass::downsample;
  if (op == "morton_codes") return CoordsPass::morton_codes;
  if (op == "morton_order") return CoordsPass::morton_order;
  std::string got = "'";  // appended piecewise: GCC 12 warns falsely on "literal" + std::string
  got.append(op).append("'");
  throw_value_error("explain", "op", "downsample_coords, morton_codes or morton_order", got);
}

CoordsProblem coords_problem(std::string_view op, const Array& coords) {
  CoordsProblem p;
  p.op = std::string(op);
  p.pass = pass_of(op);
  p.device = coords.device();
  p.n_rows = coords.ndim() >= 1 ? coords.dim(0) : 0;
  return p;
}

const backend::CoordsKernels& coords_kernels(std::string_view op, const Array& coords,
                                             const RoutePolicy& policy) {
  const Explanation e = explain(coords_problem(op, coords), backend::device_caps(),
                                effective_policy(policy, "coords"));
  const backend::CoordsKernels* k = backend::find_coords_kernels(chosen_or_throw(e));
  LATTICE_ASSERT(k != nullptr, "admitted coords route has no kernels in this build");
  return *k;
}

AlgebraProblem lookup_problem(std::string_view op, const CoordinateSet& table,
                              std::int64_t n_queries) {
  AlgebraProblem p;
  p.op = std::string(op);
  p.pass = AlgebraPass::lookup;
  p.dtype = Dtype::i32;
  p.device = table.coords().device();
  p.n_lhs = table.size();
  p.n_rhs = n_queries;
  return p;
}

Array lookup(std::string_view op, const std::shared_ptr<CoordinateSet>& table, const Array& queries,
             const RoutePolicy& policy) {
  if (!table) throw_value_error(op, "coords", "a coordinate set", "none");
  check_coords(op, "queries", queries, false);
  const CoordIndex& index = table->index(op);
  const Array q = queries.contiguous();
  const Explanation e = explain(lookup_problem(op, *table, q.dim(0)), backend::device_caps(),
                                effective_policy(policy, "algebra"));
  const backend::AlgebraKernels* k = backend::find_algebra_kernels(chosen_or_throw(e));
  LATTICE_ASSERT(k != nullptr, "admitted algebra route has no kernels in this build");
  Array rows = Array::empty({q.dim(0)}, Dtype::i64);
  backend::LookupArgs args;
  args.n_table = table->size();
  args.n_queries = q.dim(0);
  args.table = table->coords().data<std::int32_t>();
  args.queries = q.data<std::int32_t>();
  args.index = {&index, find_in_index};
  args.rows = rows.data<std::int64_t>();
  k->lookup(args);
  return rows;
}

Array morton(std::string_view op, const Array& coords, bool order, const RoutePolicy& policy) {
  check_coords(op, "coords", coords, true);
  const Array c = coords.contiguous();
  const std::int64_t n = c.dim(0), cols = c.dim(1);
  const auto* v = c.data<std::int32_t>();
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t axis = 0; axis < 3; ++axis) {
      const std::int32_t x = v[i * cols + (cols - 3) + axis];
      if (x < kMortonMin || x > kMortonMax) {
        throw_value_error(op, "coords",
                          "x, y, z within [" + std::to_string(kMortonMin) + ", " +
                              std::to_string(kMortonMax) + "] (the 21-bit Morton range)",
                          std::to_string(x) + " at row " + std::to_string(i) + ", axis " +
                              std::string(1, "xyz"[axis]));
      }
    }
  }
  const backend::CoordsKernels& k = coords_kernels(op, c, policy);
  Array out = Array::empty({n}, Dtype::i64);
  backend::MortonArgs args;
  args.n = n;
  args.cols = cols;
  args.coords = v;
  (order ? args.order : args.codes) = out.data<std::int64_t>();
  k.morton(args);
  return out;
}

}  // namespace

Array union_coords(const std::shared_ptr<CoordinateSet>& a, const std::shared_ptr<CoordinateSet>& b,
                   const RoutePolicy& policy) {
  return align("union_coords", a, b, Join::outer, policy)->output->coords();
}

Array intersection_coords(const std::shared_ptr<CoordinateSet>& a,
                          const std::shared_ptr<CoordinateSet>& b, const RoutePolicy& policy) {
  return align("intersection_coords", a, b, Join::inner, policy)->output->coords();
}

Array lookup_coords(const std::shared_ptr<CoordinateSet>& table, const Array& queries,
                    const RoutePolicy& policy) {
  return lookup("lookup_coords", table, queries, policy);
}

Array contains_coords(const std::shared_ptr<CoordinateSet>& table, const Array& queries,
                      const RoutePolicy& policy) {
  const Array rows = lookup("contains_coords", table, queries, policy);
  Array out = Array::empty({rows.dim(0)}, Dtype::boolean);
  const auto* r = rows.data<std::int64_t>();
  auto* o = out.data<bool>();
  for (std::int64_t q = 0; q < rows.dim(0); ++q) o[q] = r[q] >= 0;
  return out;
}

DownsampleOutput downsample_coords(const Array& coords, Int3 stride, const RoutePolicy& policy) {
  constexpr std::string_view op = "downsample_coords";
  check_coords(op, "coords", coords, false);
  for (std::int32_t s : stride)
    if (s < 1) throw_value_error(op, "stride", "positive integers", to_string(stride));
  const Array c = coords.contiguous();
  const backend::CoordsKernels& k = coords_kernels(op, c, policy);
  backend::DownsampleArgs args;
  args.n = c.dim(0);
  args.coords = c.data<std::int32_t>();
  args.stride = stride;
  backend::DownsampleResult r = k.downsample(args);
  return {std::move(r.coords), std::move(r.inverse)};
}

Array morton_codes(const Array& coords, const RoutePolicy& policy) {
  return morton("morton_codes", coords, false, policy);
}

Array morton_order(const Array& coords, const RoutePolicy& policy) {
  return morton("morton_order", coords, true, policy);
}

Explanation explain_coords(std::string_view op, const Array& coords) {
  return explain(coords_problem(op, coords), backend::device_caps(),
                 effective_policy({}, "coords"));
}

Explanation explain_lookup(std::string_view op, const CoordinateSet& table,
                           std::int64_t n_queries) {
  return explain(lookup_problem(op, table, n_queries), backend::device_caps(),
                 effective_policy({}, "algebra"));
}

}  // namespace lattice::ops
