// Coordinate utilities, semantic layer: set operations and lookups go through the algebra routes
// (alignment / lookup by value), downsampling and Morton codes through the coords routes.
#include "lattice/ops/coords.h"

#include <limits>
#include <string>

#include "backend/kernel_table.h"
#include "lattice/core/error.h"
#include "lattice/ops/algebra.h"
#include "ops/common.h"
#include "tensor/coord_index.h"

namespace lattice::ops {

namespace {

constexpr std::int32_t kInt32Max = std::numeric_limits<std::int32_t>::max();

std::int64_t find_in_index(const void* index, const geometry::Coord4& c) {
  return static_cast<const CoordIndex*>(index)->find(c);
}

// `arr` readable on the host: itself on the CPU, else a host copy (device inputs the semantic
// layer validates value by value, and device results it post-processes).
Array on_host(const Array& arr) { return arr.device().is_cpu() ? arr : arr.to(Device::cpu()); }

// `arr` contiguous; an array without elements becomes a fresh empty one (torch may export a
// zero-row tensor with strides such as (1, 0), which a CUDA clone would refuse).
Array packed(const Array& arr) {
  return arr.numel() == 0 ? Array::empty(arr.shape(), arr.dtype(), arr.device()) : arr.contiguous();
}

// "[op] arg: expected a tensor on <expected>, got <got>" when the devices differ.
void check_device(std::string_view op, std::string_view arg, Device expected, Device got) {
  if (got != expected) throw_value_error(op, arg, "a tensor on " + to_string(expected), to_string(got));
}

// (N, cols) int32 coordinates (CPU or CUDA), cols one of the allowed widths.
void check_coords(std::string_view op, std::string_view arg, const Array& coords,
                  bool allow_three) {
  const std::string shape = allow_three ? "shape (N, 3) or (N, 4)" : "shape (N, 4)";
  if (!coords.defined()) throw_value_error(op, arg, "an int32 array of " + shape, "nothing");
  if (coords.dtype() != Dtype::i32)
    throw_type_error(op, arg, "int32 coordinates", std::string(to_string(coords.dtype())));
  const bool ok = coords.ndim() == 2 && (coords.dim(1) == 4 || (allow_three && coords.dim(1) == 3));
  if (!ok) throw_value_error(op, arg, shape, format_shape(coords.shape()));
}

CoordsPass pass_of(std::string_view op) {
  if (op == "downsample_coords") return CoordsPass::downsample;
  if (op == "morton_codes") return CoordsPass::morton_codes;
  if (op == "morton_order") return CoordsPass::morton_order;
  if (op == "prune") return CoordsPass::prune;
  if (op == "crop") return CoordsPass::crop;
  if (op == "sparse_collate") return CoordsPass::collate;
  if (op == "dense") return CoordsPass::dense;
  if (op == "from_dense") return CoordsPass::from_dense;
  std::string got = "'";  // appended piecewise: GCC 12 warns falsely on "literal" + std::string
  got.append(op).append("'");
  throw_value_error("explain", "op",
                    "downsample_coords, morton_codes, morton_order, prune, crop, sparse_collate, "
                    "dense or from_dense",
                    got);
}

CoordsProblem coords_problem(std::string_view op, Device device, std::int64_t n_rows) {
  CoordsProblem p;
  p.op = std::string(op);
  p.pass = pass_of(op);
  p.device = device;
  p.n_rows = n_rows;
  return p;
}

CoordsProblem coords_problem(std::string_view op, const Array& coords) {
  return coords_problem(op, coords.device(), coords.ndim() >= 1 ? coords.dim(0) : 0);
}

const backend::CoordsKernels& coords_kernels(const CoordsProblem& problem,
                                             const RoutePolicy& policy) {
  const Explanation e =
      explain(problem, backend::device_caps(), effective_policy(policy, "coords"));
  const backend::CoordsKernels* k = backend::find_coords_kernels(chosen_or_throw(e));
  LATTICE_ASSERT(k != nullptr, "admitted coords route has no kernels in this build");
  return *k;
}

// A (N) / (B, X, Y, Z) bool or uint8 mask (CPU or CUDA).
void check_mask(std::string_view op, std::string_view arg, const Array& mask,
                const std::string& shape) {
  if (!mask.defined()) throw_value_error(op, arg, "a bool array of " + shape, "nothing");
  if (mask.dtype() != Dtype::boolean && mask.dtype() != Dtype::u8)
    throw_type_error(op, arg, "a bool array", std::string(to_string(mask.dtype())));
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
  const Device device = table->coords().device();
  check_device(op, "queries", device, queries.device());
  // CPU routes probe the set's index (building it rejects repeated rows); device routes hash the
  // table themselves.
  const CoordIndex* index = device.is_cpu() ? &table->index(op) : nullptr;
  const Array q = packed(queries);
  const Explanation e = explain(lookup_problem(op, *table, q.dim(0)), backend::device_caps(),
                                effective_policy(policy, "algebra"));
  const backend::AlgebraKernels* k = backend::find_algebra_kernels(chosen_or_throw(e));
  LATTICE_ASSERT(k != nullptr, "admitted algebra route has no kernels in this build");
  Array rows = Array::empty({q.dim(0)}, Dtype::i64, device);
  backend::LookupArgs args;
  args.n_table = table->size();
  args.n_queries = q.dim(0);
  args.table = table->coords().data<std::int32_t>();
  args.queries = q.data<std::int32_t>();
  if (index) args.index = {index, find_in_index};
  args.rows = rows.data<std::int64_t>();
  args.device = device;
  args.op = op;
  k->lookup(args);
  return rows;
}

Array morton(std::string_view op, const Array& coords, bool order, const RoutePolicy& policy) {
  check_coords(op, "coords", coords, true);
  const Array c = packed(coords);
  const std::int64_t n = c.dim(0), cols = c.dim(1);
  const Array host = on_host(c);
  const auto* v = host.data<std::int32_t>();
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
  Array out = Array::empty({n}, Dtype::i64, c.device());
  backend::MortonArgs args;
  args.n = n;
  args.cols = cols;
  args.coords = c.data<std::int32_t>();
  args.device = c.device();
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
  const Array found = lookup("contains_coords", table, queries, policy);
  const Array rows = on_host(found);
  Array out = Array::empty({rows.dim(0)}, Dtype::boolean);
  const auto* r = rows.data<std::int64_t>();
  auto* o = out.data<bool>();
  for (std::int64_t q = 0; q < rows.dim(0); ++q) o[q] = r[q] >= 0;
  return out.to(found.device());
}

DownsampleOutput downsample_coords(const Array& coords, Int3 stride, const RoutePolicy& policy) {
  constexpr std::string_view op = "downsample_coords";
  check_coords(op, "coords", coords, false);
  for (std::int32_t s : stride)
    if (s < 1) throw_value_error(op, "stride", "positive integers", to_string(stride));
  const Array c = packed(coords);
  const backend::CoordsKernels& k = coords_kernels(op, c, policy);
  backend::DownsampleArgs args;
  args.n = c.dim(0);
  args.coords = c.data<std::int32_t>();
  args.stride = stride;
  args.device = c.device();
  backend::DownsampleResult r = k.downsample(args);
  return {std::move(r.coords), std::move(r.inverse)};
}

Array morton_codes(const Array& coords, const RoutePolicy& policy) {
  return morton("morton_codes", coords, false, policy);
}

Array morton_order(const Array& coords, const RoutePolicy& policy) {
  return morton("morton_order", coords, true, policy);
}

Array prune_rows(const Array& coords, const Array& mask, const RoutePolicy& policy) {
  constexpr std::string_view op = "prune";
  check_coords(op, "coords", coords, false);
  const std::int64_t n = coords.dim(0);
  const std::string shape = "shape (N=" + std::to_string(n) + ",)";
  check_mask(op, "mask", mask, shape);
  if (mask.ndim() != 1 || mask.dim(0) != n)
    throw_value_error(op, "mask", shape, format_shape(mask.shape()));
  check_device(op, "mask", coords.device(), mask.device());
  const Array m = packed(mask);
  const backend::CoordsKernels& k = coords_kernels(op, coords, policy);
  backend::SelectArgs args;
  args.n = n;
  args.device = coords.device();
  args.mask = static_cast<const std::uint8_t*>(m.raw_data());
  return k.select(args);
}

Array crop_rows(const Array& coords, Int3 lo, Int3 hi, const RoutePolicy& policy) {
  constexpr std::string_view op = "crop";
  check_coords(op, "coords", coords, false);
  for (int axis = 0; axis < 3; ++axis)
    if (hi[axis] < lo[axis])
      throw_value_error(op, "hi", "values >= lo " + to_string(lo) + " on every axis",
                        to_string(hi));
  const Array c = packed(coords);
  const backend::CoordsKernels& k = coords_kernels(op, c, policy);
  backend::SelectArgs args;
  args.n = c.dim(0);
  args.coords = c.data<std::int32_t>();
  args.lo = lo;
  args.hi = hi;
  args.device = c.device();
  return k.select(args);
}

CollateOutput collate_coords(const std::vector<Array>& samples, const RoutePolicy& policy) {
  constexpr std::string_view op = "sparse_collate";
  if (samples.empty()) throw_value_error(op, "samples", "at least one sample", "an empty sequence");
  std::vector<Array> held;
  std::vector<backend::CollateSample> rows;
  std::int64_t total = 0;
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const std::string arg = "samples[" + std::to_string(i) + "] coords";
    check_coords(op, arg, samples[i], true);
    check_device(op, arg, samples.front().device(), samples[i].device());
    held.push_back(packed(samples[i]));
    rows.push_back({held.back().dim(0), held.back().dim(1), held.back().data<std::int32_t>(),
                    held.back().device()});
    total += held.back().dim(0);
  }
  const backend::CoordsKernels& k =
      coords_kernels(coords_problem(op, held.front().device(), total), policy);
  backend::CollateResult r = k.collate(rows);
  return {std::move(r.coords), std::move(r.counts)};
}

Array dense_index(const Array& coords, Int3 origin, std::array<std::int64_t, 3> size,
                  const RoutePolicy& policy) {
  constexpr std::string_view op = "dense";
  check_coords(op, "coords", coords, false);
  for (std::int64_t s : size)
    if (s < 0) throw_value_error(op, "shape", "non-negative sizes", format_shape(size));
  const Array c = packed(coords);
  const std::int64_t n = c.dim(0);
  const Array host = on_host(c);
  const auto* v = host.data<std::int32_t>();
  for (std::int64_t i = 0; i < n; ++i) {
    if (v[4 * i] < 0)
      throw_value_error(op, "coords", "batch ids >= 0",
                        "batch id " + std::to_string(v[4 * i]) + " at row " + std::to_string(i));
    for (int axis = 0; axis < 3; ++axis) {
      const std::int64_t d = std::int64_t{v[4 * i + 1 + axis]} - origin[axis];
      if (d < 0 || d >= size[axis])
        throw_value_error(op, "coords",
                          "x, y, z within [origin, origin + shape) with origin " +
                              to_string(origin) + " and shape " + format_shape(size),
                          "row " + std::to_string(i) + " " +
                              format_shape(std::array<std::int64_t, 4>{
                                  v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]}));
    }
  }
  const backend::CoordsKernels& k = coords_kernels(op, c, policy);
  Array out = Array::empty({n}, Dtype::i64, c.device());
  backend::DenseIndexArgs args;
  args.n = n;
  args.coords = c.data<std::int32_t>();
  args.device = c.device();
  args.origin = origin;
  args.size = size;
  args.index = out.data<std::int64_t>();
  k.dense_index(args);
  return out;
}

NonzeroOutput nonzero_sites(const Array& site, Int3 origin, const RoutePolicy& policy) {
  constexpr std::string_view op = "from_dense";
  check_mask(op, "dense", site, "shape (B, X, Y, Z)");
  if (site.ndim() != 4)
    throw_value_error(op, "dense", "shape (B, X, Y, Z)", format_shape(site.shape()));
  for (int axis = 0; axis < 3; ++axis)
    if (std::int64_t{origin[axis]} + site.dim(axis + 1) - 1 > std::int64_t{kInt32Max})
      throw_value_error(op, "origin", "origin + shape within int32", to_string(origin));
  const Array m = packed(site);
  const std::int64_t cells = m.dim(0) * m.dim(1) * m.dim(2) * m.dim(3);
  const backend::CoordsKernels& k = coords_kernels(coords_problem(op, m.device(), cells), policy);
  backend::NonzeroArgs args;
  args.batch = m.dim(0);
  args.size = {m.dim(1), m.dim(2), m.dim(3)};
  args.site = static_cast<const std::uint8_t*>(m.raw_data());
  args.origin = origin;
  args.device = m.device();
  backend::NonzeroResult r = k.nonzero(args);
  return {std::move(r.coords), std::move(r.index), std::move(r.counts)};
}

Explanation explain_coords(std::string_view op, std::int64_t n_rows, Device device) {
  return explain(coords_problem(op, device, n_rows), backend::device_caps(),
                 effective_policy({}, "coords"));
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
