#include "lattice/ops/quantize.h"

#include <cmath>
#include <string>

#include "backend/kernel_table.h"
#include "lattice/core/error.h"
#include "ops/common.h"
#include "ops/point_checks.h"

namespace lattice::ops {

namespace detail {

void check_points(std::string_view op, const Array& points) {
  if (!points.defined()) throw_value_error(op, "points", "a (P, 3) float array", "nothing");
  if (points.dtype() != Dtype::f32 && points.dtype() != Dtype::f64)
    throw_type_error(op, "points", "float32 or float64", to_string(points.dtype()));
  if (points.ndim() != 2 || points.dim(1) != 3)
    throw_value_error(op, "points", "shape (P, 3)", format_shape(points.shape()));
}

void check_grid(std::string_view op, const std::array<double, 3>& voxel_size,
                const std::array<double, 3>& origin) {
  for (int d = 0; d < 3; ++d) {
    if (!(voxel_size[d] > 0) || !std::isfinite(voxel_size[d]))
      throw_value_error(op, "voxel_size", "positive finite sizes",
                        std::to_string(voxel_size[d]) + " on axis " + std::to_string(d));
    if (!std::isfinite(origin[d]))
      throw_value_error(op, "origin", "finite values", std::to_string(origin[d]));
  }
}

Array checked_batch(std::string_view op, const Array* batch_indices, std::int64_t n,
                    const Device& device) {
  if (!batch_indices || !batch_indices->defined()) return {};
  const Array& b = *batch_indices;
  if (b.dtype() != Dtype::i32 && b.dtype() != Dtype::i64)
    throw_type_error(op, "batch_indices", "int32 or int64", to_string(b.dtype()));
  if (b.ndim() != 1 || b.dim(0) != n)
    throw_value_error(op, "batch_indices", "shape (P=" + std::to_string(n) + ",)",
                      format_shape(b.shape()));
  if (b.device() != device)
    throw_value_error(op, "batch_indices", "the device of points (" + to_string(device) + ")",
                      to_string(b.device()));
  const Array bc = b.contiguous();
  {  // checked and narrowed by the point_index route, on the data's device
    PointIndexProblem problem;
    problem.op = std::string(op);
    problem.pass = PointIndexPass::batch_ids;
    problem.device = device;
    problem.n_points = n;
    const std::optional<RouteId> route =
        select(problem, backend::device_caps(), RoutePolicy{});
    const backend::PointIndexKernels* k = route ? backend::find_point_index_kernels(*route) : nullptr;
    if (!k)
      throw UnsupportedError("[" + std::string(op) + "] batch_indices: expected a device this " +
                             "build supports, got " + to_string(device));
    backend::BatchIdsArgs args;
    args.n = n;
    args.dtype = bc.dtype();
    args.ids = bc.raw_data();
    args.device = device;
    backend::BatchIdsResult r = k->batch_ids(args);
    if (r.bad_row >= 0)
      throw_value_error(op, "batch_indices", r.bad_value < 0 ? "batch ids >= 0" : "batch ids below 2^31",
                        "batch id " + std::to_string(r.bad_value) + " at row " + std::to_string(r.bad_row));
    return std::move(r.batch);
  }
}

}  // namespace detail

namespace {

constexpr std::string_view kOp = "sparse_quantize";

QuantizeProblem make_problem(const Array& points) {
  QuantizeProblem p;
  p.dtype = points.dtype();
  p.device = points.device();
  p.n_points = points.ndim() >= 1 ? points.dim(0) : 0;
  return p;
}

}  // namespace

Explanation explain_quantize(const Array& points) {
  return explain(make_problem(points), backend::device_caps(), effective_policy({}, "quantize"));
}

QuantizeOutput sparse_quantize(const Array& points, const QuantizeOptions& options,
                               const Array* batch_indices) {
  return detail::quantize_points(kOp, points, options, batch_indices);
}

QuantizeOutput detail::quantize_points(std::string_view op, const Array& points,
                                       const QuantizeOptions& options, const Array* batch_indices) {
  detail::check_points(op, points);
  detail::check_grid(op, options.voxel_size, options.origin);
  const std::int64_t n = points.dim(0);
  const Array batch = detail::checked_batch(op, batch_indices, n, points.device());
  const QuantizeProblem problem = make_problem(points);
  const Explanation e =
      explain(problem, backend::device_caps(), effective_policy(options.policy, "quantize"));
  const backend::QuantizeFn fn = backend::find_quantize_kernel(chosen_or_throw(e));
  LATTICE_ASSERT(fn != nullptr, "admitted quantize route has no kernel in this build");
  const Array pts = points.contiguous();
  backend::QuantizeArgs args;
  args.dtype = pts.dtype();
  args.n_points = n;
  args.points = pts.raw_data();
  args.batch = batch.defined() ? batch.data<std::int32_t>() : nullptr;
  for (int d = 0; d < 3; ++d) {
    args.voxel_size[d] = options.voxel_size[d];
    args.origin[d] = options.origin[d];
  }
  args.drop_invalid = options.drop_invalid;
  args.device = pts.device();
  backend::QuantizeResult r = fn(args);
  if (r.first_invalid >= 0)
    throw_value_error(
        op, "points", "finite values (no NaN or inf)",
        "a non-finite value at row " + std::to_string(r.first_invalid) +
            (op == "sparse_quantize" ? " (drop_invalid=True drops such points)" : ""));
  if (r.first_overflow >= 0)
    throw_value_error(op, "points", "voxel indices within int32 (use a larger voxel_size)",
                      "an out-of-range voxel at row " + std::to_string(r.first_overflow));
  return {std::move(r.coords), std::move(r.inverse), std::move(r.counts), std::move(r.kept)};
}

}  // namespace lattice::ops
