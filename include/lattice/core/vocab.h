// Shared vocabulary of every layer: kernel geometry, relation kinds, convolution passes and
// weight layouts. Plain values only (no tensors), so the route layer can depend on it.
#pragma once

#include <array>
#include <compare>
#include <cstdint>
#include <string>
#include <string_view>

namespace lattice {

using Int3 = std::array<std::int32_t, 3>;

// Who sends to whom (SEMANTICS.md "Relations").
enum class RelationKind {
  submanifold,        // output = input rows, centered odd offsets
  forward,            // output = floor_div(c, s) (or grown with expand), centered/indexed offsets
  target,             // forward rule onto given target rows
  transposed,         // output = unique c*s + off - p, indexed offsets
  transposed_target,  // transposed rule onto given target rows
  generative,         // output = unique c*s + off (no padding), indexed offsets
};
std::string_view to_string(RelationKind kind);
// Transposed and generative relations use indexed offsets 0..K-1; the others center odd sizes.
constexpr bool uses_centered_offsets(RelationKind kind) {
  return kind == RelationKind::submanifold || kind == RelationKind::forward ||
         kind == RelationKind::target;
}
constexpr bool is_transposed_kind(RelationKind kind) {
  return kind == RelationKind::transposed || kind == RelationKind::transposed_target ||
         kind == RelationKind::generative;
}

// Kernel geometry of a relation. Every field is a per-axis triple.
struct KernelSpec {
  Int3 size{1, 1, 1};
  Int3 stride{1, 1, 1};
  Int3 padding{0, 0, 0};
  Int3 dilation{1, 1, 1};
  bool expand = false;  // forward only: grow the output to every window with an input

  std::int64_t volume() const {
    return static_cast<std::int64_t>(size[0]) * size[1] * size[2];
  }
  auto operator<=>(const KernelSpec&) const = default;
};
std::string to_string(const KernelSpec& spec);
std::string to_string(const Int3& v);

enum class ConvPass { forward, input_grad, weight_grad };
std::string_view to_string(ConvPass pass);

// Accepted weight layouts (SEMANTICS.md "Kernel geometry").
enum class WeightLayout {
  dense,         // (C_out, Kx, Ky, Kz, C_in), the mlx-lattice layout
  kernel_major,  // (K, C_in, C_out), the TorchSparse / MinkowskiEngine layout; canonical inside
};
std::string_view to_string(WeightLayout layout);

// Kernel-argument vocabulary shared by the route problems (lattice/route/problem.h) and the
// backends' argument structs (src/backend/args.h), so neither reaches the other's layer.
// Point <-> voxel conversion: the per-voxel reduction of voxelize and the map of
// build_point_voxel_map.
enum class PointReduction { sum, mean, max };  // voxelize: per-voxel reduction of point features
std::string_view to_string(PointReduction reduction);
enum class PointVoxelMode { nearest, trilinear };  // build_point_voxel_map
std::string_view to_string(PointVoxelMode mode);
// Pooling: each output row reduces the input rows of its edges; `weighted` applies fixed per-edge
// weights (trilinear_upsample3d).
enum class PoolMode { sum, avg, max, weighted };
std::string_view to_string(PoolMode mode);
// Sparse algebra: the join of two aligned coordinate sets and the elementwise combine.
enum class Join { inner, left, right, outer };
std::string_view to_string(Join join);
enum class AlgebraOp { add, sub, mul, maximum, minimum, cat };

// The views of a relation (lattice/tensor/relation.h "Views"), as bits -- one set for what a
// Relation has built (Relation::built_views) and for what a route reads in one pass
// (conv_relation_reads beside the conv route table; ops::relation_view builds exactly those).
enum RelationView : unsigned {
  kViewEdgeCount = 1u << 0,       // n_edges known (no storage)
  kViewEdgeList = 1u << 1,        // in_idx, out_idx, k_idx
  kViewOutPtr = 1u << 2,          // CSR pointer of the output rows
  kViewOffsetGrouping = 1u << 3,  // k_ptr, k_in, k_out
  kViewHostKPtr = 1u << 4,        // k_ptr on the host (host memory)
  kViewInputGrouping = 1u << 5,   // in_ptr, kt_in, kt_out
  kViewGemmMap = 1u << 6,         // the N_out x K map (always built: the stored form)
  kViewGemmOrder = 1u << 7,       // output rows in offset-mask order (tile order)
  kViewInputGemmMap = 1u << 8,    // the N_in x K map of the transposed relation
  kViewInputGemmOrder = 1u << 9,  // its rows in offset-mask order
  kViewRowMasks = 1u << 10,       // per-row offset masks (built for the orders; no route reads them)
  kViewAll = (1u << 11) - 1,
};
std::string_view to_string(AlgebraOp op);

}  // namespace lattice
