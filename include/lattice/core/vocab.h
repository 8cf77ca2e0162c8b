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
std::string_view to_string(AlgebraOp op);

}  // namespace lattice
