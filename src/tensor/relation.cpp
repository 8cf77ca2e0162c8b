// Relation building (SEMANTICS.md "Relations"): the output support of every RelationKind and
// the edge list with its output-major, per-offset and implicit-GEMM views.
//
// Everything derived from coordinates is computed in int64. A generated output coordinate that
// leaves the int32 range raises ValueError; a looked-up input coordinate outside int32 simply
// does not exist. The batch index is never convolved: it is copied from the row that derives it.
#include "lattice/tensor/relation.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend/common/geometry.h"
#include "lattice/core/error.h"
#include "lattice/core/threads.h"
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
};

namespace {

using geometry::Coord4;
using Offset = std::array<std::int64_t, 3>;
using Triple64 = std::array<std::int64_t, 3>;

// Loops over fewer (output, kernel row) pairs than this run on the calling thread: waking an
// OpenMP team costs microseconds (and whole scheduler slices when the cores are oversubscribed),
// a pair costs tens of nanoseconds. Order-of-magnitude estimate, not a benchmarked optimum.
constexpr std::int64_t kMinParallelPairs = std::int64_t{1} << 15;

Triple64 widen(const Int3& v) { return {v[0], v[1], v[2]}; }

std::int64_t spatial(const Coord4& c, int axis) {
  return axis == 0 ? c.x : (axis == 1 ? c.y : c.z);
}

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

void check_output_rows(const UniqueCoordBuilder& builder, std::string_view op) {
  if (builder.size() > geometry::kInt32Max) {
    throw_value_error(op, "coords", "fewer than 2^31 output rows", "more");
  }
}

const Coord4* rows_of(const Array& coords) {
  return reinterpret_cast<const Coord4*>(coords.data<std::int32_t>());
}

// forward, stride != 1, no expand: unique floor_div(c, s), first occurrence over input rows.
Array downsampled_support(const Coord4* in, std::int64_t n_in, const Triple64& s) {
  UniqueCoordBuilder builder(n_in);
  for (std::int64_t i = 0; i < n_in; ++i) {
    const Coord4& c = in[i];
    builder.insert(Coord4{c.b, static_cast<std::int32_t>(geometry::floor_div(c.x, s[0])),
                          static_cast<std::int32_t>(geometry::floor_div(c.y, s[1])),
                          static_cast<std::int32_t>(geometry::floor_div(c.z, s[2]))});
  }
  return builder.finish();
}

// forward with expand: every o = (c_i + p - off_k) / s that divides exactly on every axis,
// input rows then kernel rows, first occurrence.
Array expanded_support(const Coord4* in, std::int64_t n_in, const std::vector<Offset>& offsets,
                       const Triple64& s, const Triple64& p, std::string_view op) {
  UniqueCoordBuilder builder(n_in);
  for (std::int64_t i = 0; i < n_in; ++i) {
    for (const Offset& off : offsets) {
      Triple64 o{};
      bool divisible = true;
      for (int a = 0; a < 3 && divisible; ++a) {
        const std::int64_t num = spatial(in[i], a) + p[a] - off[a];
        o[a] = geometry::floor_div(num, s[a]);
        divisible = o[a] * s[a] == num;
      }
      if (!divisible) continue;
      for (int a = 0; a < 3; ++a) {
        if (!geometry::fits_int32(o[a])) throw_out_of_range(op, o[a], i);
      }
      builder.insert(Coord4{in[i].b, static_cast<std::int32_t>(o[0]),
                            static_cast<std::int32_t>(o[1]), static_cast<std::int32_t>(o[2])});
      check_output_rows(builder, op);
    }
  }
  return builder.finish();
}

// transposed / generative: unique c_i*s + off_k - p, input rows then kernel rows.
Array transposed_support(const Coord4* in, std::int64_t n_in, const std::vector<Offset>& offsets,
                         const Triple64& s, const Triple64& p, std::string_view op) {
  UniqueCoordBuilder builder(n_in);
  for (std::int64_t i = 0; i < n_in; ++i) {
    for (const Offset& off : offsets) {
      Triple64 o{};
      for (int a = 0; a < 3; ++a) {
        o[a] = spatial(in[i], a) * s[a] + off[a] - p[a];
        if (!geometry::fits_int32(o[a])) throw_out_of_range(op, o[a], i);
      }
      builder.insert(Coord4{in[i].b, static_cast<std::int32_t>(o[0]),
                            static_cast<std::int32_t>(o[1]), static_cast<std::int32_t>(o[2])});
      check_output_rows(builder, op);
    }
  }
  return builder.finish();
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

// Rows per batch of a generated output, when the input carries batch_counts (the batch id is
// copied from input rows, so it is already known to lie in [0, len)).
std::optional<std::vector<std::int64_t>> generated_batch_counts(const CoordinateSet& input,
                                                                const Array& coords) {
  if (!input.batch_counts()) return std::nullopt;
  std::vector<std::int64_t> counts(input.batch_counts()->size(), 0);
  const Coord4* rows = rows_of(coords);
  for (std::int64_t r = 0; r < coords.dim(0); ++r) ++counts[rows[r].b];
  return counts;
}

// The (n_out, K) map: input row feeding (o, k), or -1. Gather rule (forward, target,
// submanifold): c_i = o*s + off_k - p. Scatter rule (transposed kinds): o = c_i*s + off_k - p,
// i.e. c_i = (o - off_k + p) / s when that divides exactly on every axis.
Array find_edges(const CoordIndex& input_index, const Coord4* out, std::int64_t n_out,
                 const std::vector<Offset>& offsets, const Triple64& s, const Triple64& p,
                 bool scatter) {
  const auto K = static_cast<std::int64_t>(offsets.size());
  Array map = Array::empty({n_out, K}, Dtype::i32);
  std::int32_t* m = map.data<std::int32_t>();
#pragma omp parallel for schedule(static) num_threads(num_threads()) if (n_out * K >= kMinParallelPairs)
  for (std::int64_t o = 0; o < n_out; ++o) {
    const Coord4 oc = out[o];
    std::int32_t* row = m + o * K;
    for (std::int64_t k = 0; k < K; ++k) {
      Triple64 want{};
      bool exists = true;
      for (int a = 0; a < 3 && exists; ++a) {
        if (scatter) {
          const std::int64_t d = spatial(oc, a) - offsets[k][a] + p[a];
          want[a] = geometry::floor_div(d, s[a]);
          exists = want[a] * s[a] == d;
        } else {
          want[a] = spatial(oc, a) * s[a] + offsets[k][a] - p[a];
        }
        exists = exists && geometry::fits_int32(want[a]);
      }
      row[k] = exists
                   ? static_cast<std::int32_t>(input_index.find(Coord4{
                         oc.b, static_cast<std::int32_t>(want[0]),
                         static_cast<std::int32_t>(want[1]), static_cast<std::int32_t>(want[2])}))
                   : -1;
    }
  }
  return map;
}

// Compacts the map into the output-major edge list (sorted by (o, k)) and its CSR pointers.
void fill_output_major(Relation& r, const Array& map) {
  const std::int64_t n_out = r.n_out;
  const std::int64_t K = r.kernel_volume;
  const std::int32_t* m = map.data<std::int32_t>();

  r.out_ptr = Array::empty({n_out + 1}, Dtype::i64);
  std::int64_t* ptr = r.out_ptr.data<std::int64_t>();
  ptr[0] = 0;
#pragma omp parallel for schedule(static) num_threads(num_threads()) if (n_out * K >= kMinParallelPairs)
  for (std::int64_t o = 0; o < n_out; ++o) {
    std::int64_t count = 0;
    for (std::int64_t k = 0; k < K; ++k) count += m[o * K + k] >= 0;
    ptr[o + 1] = count;
  }
  for (std::int64_t o = 0; o < n_out; ++o) ptr[o + 1] += ptr[o];
  const std::int64_t E = ptr[n_out];
  r.n_edges = E;

  r.in_idx = Array::empty({E}, Dtype::i32);
  r.out_idx = Array::empty({E}, Dtype::i32);
  r.k_idx = Array::empty({E}, Dtype::i32);
  std::int32_t* in_idx = r.in_idx.data<std::int32_t>();
  std::int32_t* out_idx = r.out_idx.data<std::int32_t>();
  std::int32_t* k_idx = r.k_idx.data<std::int32_t>();
#pragma omp parallel for schedule(static) num_threads(num_threads()) if (n_out * K >= kMinParallelPairs)
  for (std::int64_t o = 0; o < n_out; ++o) {
    std::int64_t e = ptr[o];
    for (std::int64_t k = 0; k < K; ++k) {
      const std::int32_t i = m[o * K + k];
      if (i < 0) continue;
      in_idx[e] = i;
      out_idx[e] = static_cast<std::int32_t>(o);
      k_idx[e] = static_cast<std::int32_t>(k);
      ++e;
    }
  }
}

// Stable counting sort of the output-major list by k: within one k, edges stay ordered by o.
// Parallel over fixed chunks of outputs; the result does not depend on the chunking.
void fill_per_offset(Relation& r) {
  const std::int64_t n_out = r.n_out;
  const std::int64_t K = r.kernel_volume;
  const std::int64_t E = r.n_edges;
  const std::int64_t* ptr = r.out_ptr.data<std::int64_t>();
  const std::int32_t* in_idx = r.in_idx.data<std::int32_t>();
  const std::int32_t* out_idx = r.out_idx.data<std::int32_t>();
  const std::int32_t* k_idx = r.k_idx.data<std::int32_t>();

  const std::int64_t chunks =
      n_out * K < kMinParallelPairs
          ? 1
          : std::max<std::int64_t>(1, std::min<std::int64_t>(num_threads(), n_out));
  auto chunk_edges = [&](std::int64_t c) {
    return std::pair{ptr[n_out * c / chunks], ptr[n_out * (c + 1) / chunks]};
  };
  // cursor[c * K + k]: edges of offset k in chunk c, then the position of the chunk's first one.
  std::vector<std::int64_t> cursor(static_cast<std::size_t>(chunks * K), 0);
#pragma omp parallel for schedule(static) num_threads(num_threads()) if (chunks > 1)
  for (std::int64_t c = 0; c < chunks; ++c) {
    auto [begin, end] = chunk_edges(c);
    for (std::int64_t e = begin; e < end; ++e) ++cursor[c * K + k_idx[e]];
  }

  r.k_ptr = Array::empty({K + 1}, Dtype::i64);
  std::int64_t* k_ptr = r.k_ptr.data<std::int64_t>();
  std::int64_t running = 0;
  for (std::int64_t k = 0; k < K; ++k) {
    k_ptr[k] = running;
    for (std::int64_t c = 0; c < chunks; ++c) {
      const std::int64_t count = cursor[c * K + k];
      cursor[c * K + k] = running;
      running += count;
    }
  }
  k_ptr[K] = running;
  LATTICE_ASSERT(running == E, "per-offset grouping lost edges");

  r.k_in = Array::empty({E}, Dtype::i32);
  r.k_out = Array::empty({E}, Dtype::i32);
  std::int32_t* k_in = r.k_in.data<std::int32_t>();
  std::int32_t* k_out = r.k_out.data<std::int32_t>();
#pragma omp parallel for schedule(static) num_threads(num_threads()) if (chunks > 1)
  for (std::int64_t c = 0; c < chunks; ++c) {
    auto [begin, end] = chunk_edges(c);
    for (std::int64_t e = begin; e < end; ++e) {
      const std::int64_t pos = cursor[c * K + k_idx[e]]++;
      k_in[pos] = in_idx[e];
      k_out[pos] = out_idx[e];
    }
  }
}

bool is_identity(const Relation& r) {
  if (r.kernel_volume != 1 || r.n_in != r.n_out || r.n_edges != r.n_in) return false;
  const std::int32_t* in_idx = r.in_idx.data<std::int32_t>();
  const std::int32_t* out_idx = r.out_idx.data<std::int32_t>();
  for (std::int64_t e = 0; e < r.n_edges; ++e) {
    if (in_idx[e] != out_idx[e]) return false;
  }
  return true;
}

// ---- coordinates on a CUDA device: the same rules, run by the backend's device kernels ----

std::array<std::int64_t, 3> triple(const Triple64& v) { return {v[0], v[1], v[2]}; }

Array generated_support_device(const backend::DeviceCoordKernels& kernels, const Array& coords,
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
  return std::move(result.coords);
}

BuiltRelation build_relation_device(const CoordinateSet& input, const CoordIndex& input_index,
                                    RelationKind kind, const KernelSpec& spec,
                                    const CoordinateSet* target, std::string_view op, std::int64_t K,
                                    const Triple64& s, const Triple64& p) {
  const Device device = input.coords().device();
  const backend::DeviceCoordKernels& kernels = device_coord_kernels(device, op);
  const bool centered = uses_centered_offsets(kind);

  Array generated_coords;
  switch (kind) {
    case RelationKind::submanifold:
      break;
    case RelationKind::forward:
      if (spec.expand) {
        generated_coords = generated_support_device(kernels, input.coords(), backend::SupportRule::expand,
                                                    spec, centered, s, p, op);
      } else if (s != Triple64{1, 1, 1}) {
        generated_coords = generated_support_device(kernels, input.coords(),
                                                    backend::SupportRule::downsample, spec, centered, s, p, op);
      }
      break;
    case RelationKind::target:
    case RelationKind::transposed_target:
      target->index(op);  // rejects duplicate target rows
      break;
    case RelationKind::transposed:
    case RelationKind::generative:
      generated_coords = generated_support_device(kernels, input.coords(), backend::SupportRule::transposed,
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
  args.input_table = input_index.device_table();
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
  const std::int64_t n_in = input.size();
  const Coord4* in_rows = rows_of(input.coords());

  std::vector<Offset> offsets(static_cast<std::size_t>(K));
  for (std::int64_t k = 0; k < K; ++k) {
    geometry::kernel_offset(k, spec, uses_centered_offsets(kind), offsets[k].data());
  }
  // Submanifold relations have no stride or padding; generative ones have no padding.
  const bool strided = kind != RelationKind::submanifold;
  const Triple64 s = strided ? widen(spec.stride) : Triple64{1, 1, 1};
  const Triple64 p =
      (strided && kind != RelationKind::generative) ? widen(spec.padding) : Triple64{0, 0, 0};
  if (!input.coords().device().is_cpu()) {
    return build_relation_device(input, input_index, kind, spec, target, op, K, s, p);
  }

  // Output support: generated here, or the input / the target itself.
  Array generated_coords;
  switch (kind) {
    case RelationKind::submanifold:
      break;
    case RelationKind::forward:
      if (spec.expand) {
        generated_coords = expanded_support(in_rows, n_in, offsets, s, p, op);
      } else if (s != Triple64{1, 1, 1}) {
        generated_coords = downsampled_support(in_rows, n_in, s);
      }
      break;
    case RelationKind::target:
    case RelationKind::transposed_target:
      target->index(op);  // rejects duplicate target rows
      break;
    case RelationKind::transposed:
    case RelationKind::generative:
      generated_coords = transposed_support(in_rows, n_in, offsets, s, p, op);
      break;
  }

  BuiltRelation built;
  if (generated_coords.defined()) {
    built.generated =
        CoordinateSet::create(generated_coords, generated_stride(input, kind, spec, op),
                              generated_batch_counts(input, generated_coords), false, op);
  }
  const CoordinateSet& output = built.generated      ? *built.generated
                                : needs_target(kind) ? *target
                                                     : input;

  auto r = std::make_shared<Relation>();
  r->kind = kind;
  r->spec = spec;
  r->n_in = n_in;
  r->n_out = output.size();
  r->kernel_volume = K;

  Array map = find_edges(input_index, rows_of(output.coords()), r->n_out, offsets, s, p,
                         is_transposed_kind(kind));
  fill_output_major(*r, map);
  fill_per_offset(*r);
  r->identity = is_identity(*r);
  RelationBuilder::store_gemm_map(*r, std::move(map));

  built.relation = std::move(r);
  return built;
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
    if (!out_ptr.device().is_cpu()) {
      row_masks_ = device_coord_kernels(out_ptr.device(), "row_masks").row_masks(gemm_map());
      return;
    }
    const std::int64_t words = (kernel_volume + 63) / 64;
    Array masks = Array::zeros({n_out, words}, Dtype::i64);
    auto* bits = reinterpret_cast<std::uint64_t*>(masks.data<std::int64_t>());
    const std::int32_t* m = gemm_map().data<std::int32_t>();
#pragma omp parallel for schedule(static) num_threads(num_threads()) if (n_out * kernel_volume >= kMinParallelPairs)
    for (std::int64_t o = 0; o < n_out; ++o) {
      for (std::int64_t k = 0; k < kernel_volume; ++k) {
        if (m[o * kernel_volume + k] >= 0) bits[o * words + k / 64] |= std::uint64_t{1} << (k % 64);
      }
    }
    row_masks_ = std::move(masks);
  });
  return row_masks_;
}

const Relation::InputGrouping& Relation::input_grouping() const {
  std::call_once(input_once_, [this] {
    if (!out_ptr.device().is_cpu()) {
      backend::DeviceInputGroupingArgs args;
      args.n_in = n_in;
      args.kernel_volume = kernel_volume;
      args.n_edges = n_edges;
      args.in_idx = in_idx;
      args.out_idx = out_idx;
      args.k_idx = k_idx;
      backend::DeviceInputGrouping g =
          device_coord_kernels(out_ptr.device(), "input_grouping").input_grouping(args);
      input_grouping_ = InputGrouping{std::move(g.in_ptr), std::move(g.kt_in), std::move(g.kt_out)};
      return;
    }
    InputGrouping g;
    g.in_ptr = Array::zeros({n_in + 1}, Dtype::i64);
    g.kt_in = Array::empty({n_edges}, Dtype::i32);
    g.kt_out = Array::empty({n_edges}, Dtype::i32);
    std::int64_t* ptr = g.in_ptr.data<std::int64_t>();
    const std::int32_t* in = in_idx.data<std::int32_t>();
    for (std::int64_t e = 0; e < n_edges; ++e) ++ptr[in[e] + 1];
    for (std::int64_t i = 0; i < n_in; ++i) ptr[i + 1] += ptr[i];
    const std::int64_t* kp = k_ptr.data<std::int64_t>();
    const std::int32_t* src_in = k_in.data<std::int32_t>();
    const std::int32_t* src_out = k_out.data<std::int32_t>();
    std::int32_t* dst_in = g.kt_in.data<std::int32_t>();
    std::int32_t* dst_out = g.kt_out.data<std::int32_t>();
    // Within one offset every input row occurs at most once, so sorting by input row is a total
    // order and the result does not depend on the thread count.
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads()) if (n_edges >= kMinParallelPairs)
    for (std::int64_t k = 0; k < kernel_volume; ++k) {
      const std::int64_t b = kp[k], n = kp[k + 1] - kp[k];
      std::vector<std::pair<std::int32_t, std::int32_t>> pairs(static_cast<std::size_t>(n));
      for (std::int64_t e = 0; e < n; ++e) pairs[static_cast<std::size_t>(e)] = {src_in[b + e], src_out[b + e]};
      std::sort(pairs.begin(), pairs.end());
      for (std::int64_t e = 0; e < n; ++e) {
        dst_in[b + e] = pairs[static_cast<std::size_t>(e)].first;
        dst_out[b + e] = pairs[static_cast<std::size_t>(e)].second;
      }
    }
    input_grouping_ = std::move(g);
  });
  return input_grouping_;
}

}  // namespace lattice
