// Semantic layer of the point <-> voxel family (voxelize, build_point_voxel_map, devoxelize):
// validates arguments, groups points / builds maps, fills a PointVoxelProblem, asks the route
// layer and runs the chosen kernel from the kernel table.
#include "lattice/ops/point_voxel.h"

#include <string>
#include <vector>

#include "backend/kernel_table.h"
#include "lattice/core/error.h"
#include "ops/common.h"
#include "ops/point_checks.h"
#include "tensor/coord_index.h"

namespace lattice::ops {

namespace {

constexpr std::string_view kVoxelize = "voxelize";
constexpr std::string_view kDevoxelize = "devoxelize";
constexpr std::string_view kBuildMap = "build_point_voxel_map";

const backend::PointVoxelKernels& choose(const PointVoxelProblem& problem,
                                         const RoutePolicy& policy) {
  const Explanation e =
      explain(problem, backend::device_caps(), effective_policy(policy, "point_voxel"));
  const backend::PointVoxelKernels* k = backend::find_point_voxel_kernels(chosen_or_throw(e));
  LATTICE_ASSERT(k != nullptr, "admitted point_voxel route has no kernels in this build");
  return *k;
}

// A float feature array of shape (rows, C) on `device` (that of the points and voxels); returns C.
std::int64_t check_feats(std::string_view op, std::string_view what, const Array& a,
                         std::int64_t rows, std::string_view rows_name, const Device& device) {
  if (!a.defined())
    throw_value_error(op, what, "an (" + std::string(rows_name) + ", C) float array", "nothing");
  if (!is_floating(a.dtype()))
    throw_type_error(op, what, "float16, bfloat16, float32 or float64", to_string(a.dtype()));
  if (a.ndim() != 2 || a.dim(0) != rows)
    throw_value_error(op, what,
                      "shape (" + std::string(rows_name) + "=" + std::to_string(rows) + ", C)",
                      format_shape(a.shape()));
  if (a.device() != device)
    throw_value_error(op, what, "a tensor on " + to_string(device), to_string(a.device()));
  return a.dim(1);
}

PointVoxelProblem voxelize_problem(const PointGrouping& g, const Array& feats, PointReduction r,
                                   PointVoxelPass pass) {
  PointVoxelProblem p;
  p.op = std::string(kVoxelize);
  p.pass = pass;
  p.dtype = feats.dtype();
  p.device = feats.device();
  p.n_points = g.n_points();
  p.n_voxels = g.n_voxels();
  p.channels = feats.ndim() == 2 ? feats.dim(1) : 0;
  p.n_pairs = g.n_points();
  p.detail = std::string(to_string(r));
  return p;
}

PointVoxelProblem devoxelize_problem(const PointVoxelMap& m, const Array& feats,
                                     PointVoxelPass pass) {
  PointVoxelProblem p;
  p.op = std::string(kDevoxelize);
  p.pass = pass;
  p.dtype = feats.dtype();
  p.device = feats.device();
  p.n_points = m.n_points;
  p.n_voxels = m.n_voxels;
  p.channels = feats.ndim() == 2 ? feats.dim(1) : 0;
  p.n_pairs = m.entries.defined() ? m.entries.dim(0) : 0;
  p.detail = std::string(to_string(m.mode));
  return p;
}

PointVoxelProblem map_problem(const Array& points, std::int64_t n_voxels, PointVoxelMode mode) {
  PointVoxelProblem p;
  p.op = std::string(kBuildMap);
  p.pass = PointVoxelPass::build_map;
  p.dtype = points.dtype();
  p.device = points.device();
  p.n_points = points.ndim() >= 1 ? points.dim(0) : 0;
  p.n_voxels = n_voxels;
  p.n_pairs = p.n_points * (mode == PointVoxelMode::trilinear ? 8 : 1);
  p.detail = std::string(to_string(mode));
  return p;
}

backend::DevoxelizeArgs devoxelize_args(const PointVoxelMap& m, Dtype dtype,
                                        std::int64_t channels) {
  backend::DevoxelizeArgs a;
  a.dtype = dtype;
  a.weight_dtype = m.weights.dtype();
  a.n_points = m.n_points;
  a.n_voxels = m.n_voxels;
  a.channels = channels;
  a.width = m.indices.dim(1);
  a.indices = m.indices.data<std::int64_t>();
  a.weights = m.weights.raw_data();
  a.voxel_ptr = m.voxel_ptr.data<std::int64_t>();
  a.entries = m.entries.data<std::int64_t>();
  a.device = m.indices.device();
  return a;
}

void check_map_voxels(std::string_view op, const PointVoxelMap& map,
                      const std::shared_ptr<CoordinateSet>& voxels) {
  if (!voxels) throw_value_error(op, "voxels", "a SparseTensor", "an empty SparseTensor");
  if (voxels->key() != map.voxel_key)
    throw_value_error(op, "map",
                      "a map built for these voxels (coordinate key " +
                          std::to_string(voxels->key()) + ", " + std::to_string(voxels->size()) +
                          " rows)",
                      "a map built for coordinate key " + std::to_string(map.voxel_key) + " (" +
                          std::to_string(map.n_voxels) + " rows)");
}

}  // namespace

// ---- voxelize
// ------------------------------------------------------------------------------------

PointGrouping group_points(const Array& points, const QuantizeOptions& options,
                           const Array* batch_indices, std::string_view op) {
  QuantizeOptions q = options;
  q.drop_invalid = false;
  QuantizeOutput out = detail::quantize_points(op, points, q, batch_indices);
  PointGrouping g;
  g.voxels = CoordinateSet::create(out.coords, {1, 1, 1}, std::nullopt, false, op);
  g.inverse = std::move(out.inverse);
  g.counts = std::move(out.counts);
  {  // the CSR of points per voxel (a stable grouping), by the point_index route
    PointIndexProblem problem;
    problem.op = std::string(op);
    problem.pass = PointIndexPass::group;
    problem.device = g.inverse.device();
    problem.n_points = g.inverse.dim(0);
    const std::optional<RouteId> route =
        select(problem, backend::device_caps(), RoutePolicy{});
    const backend::PointIndexKernels* k = route ? backend::find_point_index_kernels(*route) : nullptr;
    LATTICE_ASSERT(k != nullptr, "points on a device without point index kernels");
    backend::PointGroupArgs args;
    args.n_points = g.inverse.dim(0);
    args.n_voxels = g.counts.dim(0);
    args.inverse = g.inverse.data<std::int64_t>();
    args.device = g.inverse.device();
    backend::PointGroupResult r = k->group(args);
    g.voxel_ptr = std::move(r.voxel_ptr);
    g.point_idx = std::move(r.point_idx);
    return g;
  }
}

namespace {

// The point -> voxel grouping part of VoxelizeArgs, shared by the forward and backward passes.
backend::VoxelizeArgs grouping_args(const PointGrouping& g, Dtype dtype, PointReduction reduction,
                                    std::int64_t c) {
  backend::VoxelizeArgs a;
  a.dtype = dtype;
  a.reduction = reduction;
  a.n_points = g.n_points();
  a.n_voxels = g.n_voxels();
  a.channels = c;
  a.inverse = g.inverse.data<std::int64_t>();
  a.counts = g.counts.data<std::int64_t>();
  a.voxel_ptr = g.voxel_ptr.data<std::int64_t>();
  a.point_idx = g.point_idx.data<std::int64_t>();
  a.device = g.inverse.device();
  return a;
}

}  // namespace

VoxelizeForward voxelize_forward(const PointGrouping& g, const Array& feats,
                                 PointReduction reduction, const RoutePolicy& policy) {
  const std::int64_t c =
      check_feats(kVoxelize, "feats", feats, g.n_points(), "P", g.inverse.device());
  const Array x = feats.contiguous();
  const auto& k = choose(voxelize_problem(g, x, reduction, PointVoxelPass::forward), policy);
  VoxelizeForward out;
  out.feats = Array::empty({g.n_voxels(), c}, x.dtype(), x.device());
  if (reduction == PointReduction::max)
    out.argmax = Array::empty({g.n_voxels(), c}, Dtype::i64, x.device());
  backend::VoxelizeArgs a = grouping_args(g, x.dtype(), reduction, c);
  a.feats = x.raw_data();
  a.out = out.feats.raw_data();
  a.argmax = out.argmax.defined() ? out.argmax.data<std::int64_t>() : nullptr;
  k.voxelize_forward(a);
  return out;
}

Array voxelize_backward(const PointGrouping& g, const Array& grad_out, const Array& argmax,
                        PointReduction reduction, const RoutePolicy& policy) {
  const std::int64_t c =
      check_feats(kVoxelize, "grad_out", grad_out, g.n_voxels(), "M", g.inverse.device());
  if (reduction == PointReduction::max &&
      (!argmax.defined() || argmax.dtype() != Dtype::i64 || argmax.ndim() != 2 ||
       argmax.dim(0) != g.n_voxels() || argmax.dim(1) != c || argmax.device() != grad_out.device()))
    throw_value_error(kVoxelize, "argmax",
                      "the forward's (M=" + std::to_string(g.n_voxels()) +
                          ", C=" + std::to_string(c) + ") int64 argmax for reduction 'max'",
                      argmax.defined() ? std::string(to_string(argmax.dtype())) + " " +
                                             format_shape(argmax.shape())
                                       : std::string("nothing"));
  const Array dy = grad_out.contiguous();
  const Array arg = argmax.defined() ? argmax.contiguous() : Array();
  const auto& k = choose(voxelize_problem(g, dy, reduction, PointVoxelPass::backward), policy);
  Array dx = Array::empty({g.n_points(), c}, dy.dtype(), dy.device());
  backend::VoxelizeArgs a = grouping_args(g, dy.dtype(), reduction, c);
  a.dy = dy.raw_data();
  a.argmax = arg.defined() ? arg.data<std::int64_t>() : nullptr;
  a.dfeats = dx.raw_data();
  k.voxelize_backward(a);
  return dx;
}

SparseTensor voxelize(const Array& points, const Array& feats, const VoxelizeOptions& options,
                      const Array* batch_indices) {
  QuantizeOptions q;
  q.voxel_size = options.voxel_size;
  q.origin = options.origin;
  const PointGrouping g = group_points(points, q, batch_indices, kVoxelize);
  return SparseTensor(g.voxels,
                      voxelize_forward(g, feats, options.reduction, options.policy).feats);
}

Explanation explain_voxelize(const PointGrouping& g, const Array& feats, PointReduction reduction,
                             PointVoxelPass pass, const RoutePolicy& policy) {
  return explain(voxelize_problem(g, feats, reduction, pass), backend::device_caps(),
                 effective_policy(policy, "point_voxel"));
}

// ---- build_point_voxel_map
// -----------------------------------------------------------------------

std::shared_ptr<const PointVoxelMap> build_point_voxel_map(
    const Array& points, const std::shared_ptr<CoordinateSet>& voxels,
    const PointVoxelMapOptions& options, const Array* batch_indices) {
  detail::check_points(kBuildMap, points);
  detail::check_grid(kBuildMap, options.voxel_size, options.origin);
  if (!voxels) throw_value_error(kBuildMap, "voxels", "a SparseTensor", "an empty SparseTensor");
  if (voxels->coords().device() != points.device())
    throw_value_error(kBuildMap, "voxels", "a tensor on " + to_string(points.device()),
                      to_string(voxels->coords().device()));
  const std::int64_t n = points.dim(0);
  const Array batch = detail::checked_batch(kBuildMap, batch_indices, n, points.device());
  const CoordIndex& index = voxels->index(kBuildMap);  // raises on duplicate voxel rows
  const auto& k = choose(map_problem(points, voxels->size(), options.mode), options.policy);
  const Array pts = points.contiguous();
  backend::PointVoxelMapArgs a;
  a.dtype = pts.dtype();
  a.n_points = n;
  a.n_voxels = voxels->size();
  a.points = pts.raw_data();
  a.batch = batch.defined() ? batch.data<std::int32_t>() : nullptr;
  for (int d = 0; d < 3; ++d) {
    a.voxel_size[d] = options.voxel_size[d];
    a.stride[d] = voxels->stride()[d];
    a.origin[d] = options.origin[d];
  }
  a.mode = options.mode;
  a.normalize = options.normalize;
  a.device = pts.device();
  a.voxel_coords = voxels->coords().data<std::int32_t>();
  if (const backend::DeviceCoordTable* t = index.device_table(); t && t->slots.defined()) {
    a.voxel_slots = t->slots.data<std::int32_t>();
    a.voxel_mask = t->mask;
  }
  a.lookup.context = &index;
  a.lookup.find = [](const void* ctx, std::int32_t b, std::int32_t x, std::int32_t y,
                     std::int32_t z) {
    return static_cast<const CoordIndex*>(ctx)->find(geometry::Coord4{b, x, y, z});
  };
  backend::PointVoxelMapResult r = k.build_map(a);
  if (r.first_invalid >= 0)
    throw_value_error(kBuildMap, "points", "finite values (no NaN or inf)",
                      "a non-finite value at row " + std::to_string(r.first_invalid));
  auto map = std::make_shared<PointVoxelMap>();
  LATTICE_ASSERT(r.duplicate_row < 0, "build_point_voxel_map: voxel rows are not unique");
  map->mode = options.mode;
  map->normalize = options.normalize;
  map->voxel_key = voxels->key();
  map->n_points = n;
  map->n_voxels = voxels->size();
  map->stride = voxels->stride();
  map->voxel_size = options.voxel_size;
  map->origin = options.origin;
  map->indices = std::move(r.indices);
  map->weights = std::move(r.weights);
  map->voxel_ptr = std::move(r.voxel_ptr);
  map->entries = std::move(r.entries);
  return map;
}

Explanation explain_build_point_voxel_map(const Array& points,
                                          const std::shared_ptr<CoordinateSet>& voxels,
                                          PointVoxelMode mode, const RoutePolicy& policy) {
  return explain(map_problem(points, voxels ? voxels->size() : 0, mode), backend::device_caps(),
                 effective_policy(policy, "point_voxel"));
}

// ---- devoxelize
// ----------------------------------------------------------------------------------

Array devoxelize_forward(const PointVoxelMap& map, const std::shared_ptr<CoordinateSet>& voxels,
                         const Array& voxel_feats, const RoutePolicy& policy) {
  check_map_voxels(kDevoxelize, map, voxels);
  const std::int64_t c =
      check_feats(kDevoxelize, "feats", voxel_feats, map.n_voxels, "M", map.indices.device());
  const Array x = voxel_feats.contiguous();
  const auto& k = choose(devoxelize_problem(map, x, PointVoxelPass::forward), policy);
  Array y = Array::empty({map.n_points, c}, x.dtype(), x.device());
  backend::DevoxelizeArgs a = devoxelize_args(map, x.dtype(), c);
  a.voxel_feats = x.raw_data();
  a.out = y.raw_data();
  k.devoxelize_forward(a);
  return y;
}

Array devoxelize_backward(const PointVoxelMap& map, const Array& grad_out,
                          const RoutePolicy& policy) {
  const std::int64_t c =
      check_feats(kDevoxelize, "grad_out", grad_out, map.n_points, "P", map.indices.device());
  const Array dy = grad_out.contiguous();
  const auto& k = choose(devoxelize_problem(map, dy, PointVoxelPass::backward), policy);
  Array dv = Array::empty({map.n_voxels, c}, dy.dtype(), dy.device());
  backend::DevoxelizeArgs a = devoxelize_args(map, dy.dtype(), c);
  a.dy = dy.raw_data();
  a.dvoxel = dv.raw_data();
  k.devoxelize_backward(a);
  return dv;
}

Array devoxelize(const SparseTensor& voxels, const PointVoxelMap& map, const RoutePolicy& policy) {
  return devoxelize_forward(map, voxels.coordinate_set(), voxels.feats(), policy);
}

Explanation explain_devoxelize(const PointVoxelMap& map, const Array& voxel_feats,
                               PointVoxelPass pass, const RoutePolicy& policy) {
  return explain(devoxelize_problem(map, voxel_feats, pass), backend::device_caps(),
                 effective_policy(policy, "point_voxel"));
}

}  // namespace lattice::ops
