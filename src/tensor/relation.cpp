// Relation building (SEMANTICS.md "Relations"): the output support of every RelationKind and
// the edge list with its output-major, per-offset and implicit-GEMM views.
//
// Everything derived from coordinates is computed in int64. A generated output coordinate that
// leaves the int32 range raises ValueError; a looked-up input coordinate outside int32 simply
// does not exist. The batch index is never convolved: it is copied from the row that derives it.
#include "lattice/tensor/relation.h"

#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend/common/geometry.h"
#include "lattice/core/error.h"
#include "lattice/tensor/coordinate_set.h"
#include "tensor/coord_index.h"

namespace lattice {

// Privileged access for build_relation: stores the gemm map computed while finding the edges so
// Relation::gemm_map() does not recompute it.
struct RelationBuilder {
  static void store_gemm_map(const Relation& relation, Array map) {
    relation.gemm_map_ = std::move(map);
    std::call_once(relation.gemm_once_, [] {});
  }
  // The transpose has the same per-offset segments as the relation it transposes.
  static void store_host_k_ptr(const Relation& relation, const std::vector<std::int64_t>& k_ptr) {
    std::call_once(relation.host_k_ptr_once_, [&] { relation.host_k_ptr_ = k_ptr; });
  }
};

namespace {

using Triple64 = std::array<std::int64_t, 3>;

Triple64 widen(const Int3& v) { return {v[0], v[1], v[2]}; }

bool needs_target(RelationKind kind) {
  return kind == RelationKind::target || kind == RelationKind::transposed_target;
}

// Kernel geometry checks shared by every kind; returns the kernel volume (< 2^31, since kernel
// rows are stored as int32).
std::int64_t validate_spec(RelationKind kind, const KernelSpec& spec, std::string_view op) {
  for (int a = 0; a < 3; ++a) {
    if (spec.size[a] < 1) {
      throw_value_error(op, "kernel_size", "positive sizes", to_string(spec.size));
    }
    if (spec.stride[a] < 1) {
      throw_value_error(op, "stride", "positive strides", to_string(spec.stride));
    }
    if (spec.padding[a] < 0) {
      throw_value_error(op, "padding", "non-negative padding", to_string(spec.padding));
    }
    if (spec.dilation[a] < 1) {
      throw_value_error(op, "dilation", "positive dilation", to_string(spec.dilation));
    }
  }
  if (kind == RelationKind::submanifold) {
    for (int a = 0; a < 3; ++a) {
      if (spec.size[a] % 2 == 0) {
        throw_value_error(op, "kernel_size", "odd sizes for a submanifold relation",
                          to_string(spec.size));
      }
    }
  }
  const std::int64_t kxy = static_cast<std::int64_t>(spec.size[0]) * spec.size[1];
  if (kxy > geometry::kInt32Max || kxy * spec.size[2] > geometry::kInt32Max) {
    throw_value_error(op, "kernel_size", "a kernel volume below 2^31", to_string(spec.size));
  }
  return kxy * spec.size[2];
}

[[noreturn]] void throw_out_of_range(std::string_view op, std::int64_t value, std::int64_t row) {
  throw_value_error(op, "coords",
                    "output coordinates within the int32 range [-2147483648, 2147483647]",
                    std::to_string(value) + " at input row " + std::to_string(row));
}

// Stride of a generated output: forward multiplies, transposed/generative divide exactly.
Int3 generated_stride(const CoordinateSet& input, RelationKind kind, const KernelSpec& spec,
                      std::string_view op) {
  Int3 out{};
  for (int a = 0; a < 3; ++a) {
    const std::int64_t in = input.stride()[a];
    const std::int64_t s = spec.stride[a];
    if (is_transposed_kind(kind)) {
      if (in % s != 0) {
        throw_value_error(op, "stride",
                          "a divisor of the input stride " + to_string(input.stride()),
                          to_string(spec.stride));
      }
      out[a] = static_cast<std::int32_t>(in / s);
    } else {
      if (!geometry::fits_int32(in * s)) {
        throw_value_error(op, "stride",
                          "an output stride (input stride " + to_string(input.stride()) +
                              " times stride) within int32",
                          to_string(spec.stride));
      }
      out[a] = static_cast<std::int32_t>(in * s);
    }
  }
  return out;
}

// ---- the relation route (cpu_hash, cuda_hash) runs every rule on the coordinates' device ----

std::array<std::int64_t, 3> triple(const Triple64& v) { return {v[0], v[1], v[2]}; }

Array generated_support(const backend::RelationKernels& kernels, const Array& coords,
                               backend::SupportRule rule, const KernelSpec& spec, bool centered,
                               const Triple64& s, const Triple64& p, std::string_view op) {
  backend::DeviceSupportArgs args;
  args.rule = rule;
  args.coords = coords;
  args.spec = spec;
  args.centered = centered;
  args.stride = triple(s);
  args.padding = triple(p);
  backend::DeviceSupportResult result = kernels.support(args);
  if (result.overflow_row >= 0) throw_out_of_range(op, result.overflow_value, result.overflow_row);
  if (result.too_many_rows) throw_value_error(op, "coords", "fewer than 2^31 output rows", "more");
  return std::move(result.coords);
}

BuiltRelation build_with_route(const backend::RelationKernels& kernels, const CoordinateSet& input,
                               const CoordIndex& input_index, RelationKind kind, const KernelSpec& spec,
                               const CoordinateSet* target, std::string_view op, std::int64_t K,
                               const Triple64& s, const Triple64& p) {
  const bool centered = uses_centered_offsets(kind);

  Array generated_coords;
  switch (kind) {
    case RelationKind::submanifold:
      break;
    case RelationKind::forward:
      if (spec.expand) {
        generated_coords = generated_support(kernels, input.coords(), backend::SupportRule::expand,
                                                    spec, centered, s, p, op);
      } else if (s != Triple64{1, 1, 1}) {
        generated_coords = generated_support(kernels, input.coords(),
                                                    backend::SupportRule::downsample, spec, centered, s, p, op);
      }
      break;
    case RelationKind::target:
    case RelationKind::transposed_target:
      target->index(op);  // rejects duplicate target rows
      break;
    case RelationKind::transposed:
    case RelationKind::generative:
      generated_coords = generated_support(kernels, input.coords(), backend::SupportRule::transposed,
                                                  spec, centered, s, p, op);
      break;
  }

  BuiltRelation built;
  if (generated_coords.defined()) {
    std::optional<std::vector<std::int64_t>> counts;
    if (input.batch_counts()) {
      counts = kernels.batch_histogram(generated_coords, static_cast<std::int64_t>(input.batch_counts()->size()))
                   .counts;
    }
    built.generated = CoordinateSet::create(generated_coords, generated_stride(input, kind, spec, op),
                                            std::move(counts), false, op);
  }
  const CoordinateSet& output = built.generated      ? *built.generated
                                : needs_target(kind) ? *target
                                                     : input;

  auto r = std::make_shared<Relation>();
  r->kind = kind;
  r->spec = spec;
  r->n_in = input.size();
  r->n_out = output.size();
  r->kernel_volume = K;

  backend::DeviceEdgeArgs args;
  args.input = input.coords();
  args.input_table = &input_index.table();
  args.output = output.coords();
  args.spec = spec;
  args.centered = centered;
  args.kernel_volume = K;
  args.stride = triple(s);
  args.padding = triple(p);
  args.scatter = is_transposed_kind(kind);
  backend::DeviceEdges edges = kernels.edges(args);
  r->n_edges = edges.n_edges;
  r->identity = edges.identity;
  r->in_idx = std::move(edges.in_idx);
  r->out_idx = std::move(edges.out_idx);
  r->k_idx = std::move(edges.k_idx);
  r->out_ptr = std::move(edges.out_ptr);
  r->k_ptr = std::move(edges.k_ptr);
  r->k_in = std::move(edges.k_in);
  r->k_out = std::move(edges.k_out);
  RelationBuilder::store_gemm_map(*r, std::move(edges.map));

  built.relation = std::move(r);
  return built;
}

}  // namespace

BuiltRelation build_relation(const CoordinateSet& input, RelationKind kind, const KernelSpec& spec,
                             const CoordinateSet* target, std::string_view op) {
  const std::int64_t K = validate_spec(kind, spec, op);
  if (needs_target(kind) && target == nullptr) {
    throw_value_error(op, "target",
                      "a target coordinate set for a " + std::string(to_string(kind)) + " relation",
                      "none");
  }
  if (needs_target(kind) && target->coords().device() != input.coords().device()) {
    throw_value_error(op, "coordinates",
                      "the device of the input (" + to_string(input.coords().device()) + ")",
                      to_string(target->coords().device()));
  }
  const CoordIndex& input_index = input.index(op);  // rejects duplicate input rows
  // Submanifold relations have no stride or padding; generative ones have no padding.
  const bool strided = kind != RelationKind::submanifold;
  const Triple64 s = strided ? widen(spec.stride) : Triple64{1, 1, 1};
  const Triple64 p =
      (strided && kind != RelationKind::generative) ? widen(spec.padding) : Triple64{0, 0, 0};
  return build_with_route(relation_kernels(relation_problem(input, kind, K, op)), input, input_index, kind,
                          spec, target, op, K, s, p);
}

bool transposes_forward(const KernelSpec& spec) {
  for (int a = 0; a < 3; ++a)
    if (spec.size[a] % 2 == 1 && spec.size[a] != 1) return false;
  return true;
}

std::shared_ptr<Relation> transpose_relation(const Relation& forward, RelationKind kind, std::string_view op) {
  const backend::RelationKernels& kernels = relation_kernels(relation_problem(forward, op));
  LATTICE_ASSERT(kernels.transpose != nullptr, "relation route has no transpose kernel");
  backend::DeviceTransposeArgs args;
  args.n_in = forward.n_in;
  args.n_out = forward.n_out;
  args.kernel_volume = forward.kernel_volume;
  args.n_edges = forward.n_edges;
  args.in_idx = forward.in_idx;
  args.out_idx = forward.out_idx;
  args.k_idx = forward.k_idx;
  backend::DeviceEdges edges = kernels.transpose(args);
  auto r = std::make_shared<Relation>();
  r->kind = kind;
  r->spec = forward.spec;
  r->spec.expand = false;
  r->n_in = forward.n_out;
  r->n_out = forward.n_in;
  r->kernel_volume = forward.kernel_volume;
  r->n_edges = edges.n_edges;
  r->identity = edges.identity;
  r->in_idx = std::move(edges.in_idx);
  r->out_idx = std::move(edges.out_idx);
  r->k_idx = std::move(edges.k_idx);
  r->out_ptr = std::move(edges.out_ptr);
  r->k_ptr = std::move(edges.k_ptr);
  r->k_in = std::move(edges.k_in);
  r->k_out = std::move(edges.k_out);
  RelationBuilder::store_gemm_map(*r, std::move(edges.map));
  RelationBuilder::store_host_k_ptr(*r, forward.host_k_ptr());
  return r;
}

RelationProblem relation_problem(const CoordinateSet& input, RelationKind kind, std::int64_t kernel_volume,
                                 std::string_view op) {
  RelationProblem p;
  p.op = std::string(op);
  p.pass = RelationPass::build;
  p.relation = kind;
  p.device = input.coords().device();
  p.n_rows = input.size();
  p.kernel_volume = kernel_volume;
  return p;
}

RelationProblem relation_problem(const Relation& relation, std::string_view op) {
  RelationProblem p;
  p.op = std::string(op);
  p.pass = RelationPass::build;
  p.relation = relation.kind;
  p.device = relation.out_ptr.device();
  p.n_rows = relation.n_in;
  p.kernel_volume = relation.kernel_volume;
  return p;
}

const Array& Relation::gemm_map() const {
  std::call_once(gemm_once_, [this] {
    Array map = Array::empty({n_out, kernel_volume}, Dtype::i32);
    std::int32_t* m = map.data<std::int32_t>();
    std::fill(m, m + n_out * kernel_volume, -1);
    const std::int32_t* in = in_idx.data<std::int32_t>();
    const std::int32_t* out = out_idx.data<std::int32_t>();
    const std::int32_t* k = k_idx.data<std::int32_t>();
    for (std::int64_t e = 0; e < n_edges; ++e) {
      m[static_cast<std::int64_t>(out[e]) * kernel_volume + k[e]] = in[e];
    }
    gemm_map_ = std::move(map);
  });
  return gemm_map_;
}

// Stored as int64 (the Array dtypes have no uint64); read the words as uint64 bit patterns.
const Array& Relation::row_masks() const {
  std::call_once(masks_once_, [this] {
    row_masks_ = relation_kernels(relation_problem(*this, "row_masks")).row_masks(gemm_map());
  });
  return row_masks_;
}

const std::vector<std::int64_t>& Relation::host_k_ptr() const {
  std::call_once(host_k_ptr_once_, [this] {
    const Array h = k_ptr.device().is_cpu() ? k_ptr : k_ptr.to(Device::cpu());
    const std::int64_t* p = h.data<std::int64_t>();
    host_k_ptr_.assign(p, p + kernel_volume + 1);
  });
  return host_k_ptr_;
}

const Relation::InputGrouping& Relation::input_grouping() const {
  std::call_once(input_once_, [this] {
    backend::DeviceInputGroupingArgs args;
    args.n_in = n_in;
    args.kernel_volume = kernel_volume;
    args.n_edges = n_edges;
    args.in_idx = in_idx;
    args.out_idx = out_idx;
    args.k_idx = k_idx;
    args.k_ptr = k_ptr;
    args.k_in = k_in;
    args.k_out = k_out;
    backend::DeviceInputGrouping g =
        relation_kernels(relation_problem(*this, "input_grouping")).input_grouping(args);
    input_grouping_ = InputGrouping{std::move(g.in_ptr), std::move(g.kt_in), std::move(g.kt_out)};
  });
  return input_grouping_;
}

}  // namespace lattice
