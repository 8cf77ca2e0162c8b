#include "lattice/core/vocab.h"

#include "lattice/core/device.h"

namespace lattice {

std::string_view to_string(RelationKind kind) {
  switch (kind) {
    case RelationKind::submanifold: return "submanifold";
    case RelationKind::forward: return "forward";
    case RelationKind::target: return "target";
    case RelationKind::transposed: return "transposed";
    case RelationKind::transposed_target: return "transposed_target";
    case RelationKind::generative: return "generative";
  }
  return "unknown";
}

std::string to_string(const Int3& v) {
  // Appended piecewise: GCC 12 reports a false -Wrestrict on `"(" + std::to_string(...)` chains.
  std::string s = "(";
  s.append(std::to_string(v[0])).append(", ").append(std::to_string(v[1])).append(", ");
  s.append(std::to_string(v[2])).append(")");
  return s;
}

std::string to_string(const KernelSpec& spec) {
  std::string s = "kernel " + to_string(spec.size) + " stride " + to_string(spec.stride);
  if (spec.padding != Int3{0, 0, 0}) s += " padding " + to_string(spec.padding);
  if (spec.dilation != Int3{1, 1, 1}) s += " dilation " + to_string(spec.dilation);
  if (spec.expand) s += " expand";
  return s;
}

std::string_view to_string(ConvPass pass) {
  switch (pass) {
    case ConvPass::forward: return "forward";
    case ConvPass::input_grad: return "input_grad";
    case ConvPass::weight_grad: return "weight_grad";
  }
  return "unknown";
}

std::string_view to_string(WeightLayout layout) {
  switch (layout) {
    case WeightLayout::dense: return "(C_out, Kx, Ky, Kz, C_in)";
    case WeightLayout::kernel_major: return "(K, C_in, C_out)";
  }
  return "unknown";
}

std::string to_string(Device device) {
  return device.is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(device.index);
}

std::string_view to_string(PointReduction r) {
  switch (r) {
    case PointReduction::sum: return "sum";
    case PointReduction::mean: return "mean";
    case PointReduction::max: return "max";
  }
  return "unknown";
}

std::string_view to_string(PointVoxelMode m) {
  switch (m) {
    case PointVoxelMode::nearest: return "nearest";
    case PointVoxelMode::trilinear: return "trilinear";
  }
  return "unknown";
}

std::string_view to_string(PoolMode m) {
  switch (m) {
    case PoolMode::sum: return "sum";
    case PoolMode::avg: return "avg";
    case PoolMode::max: return "max";
    case PoolMode::weighted: return "weighted";
  }
  return "unknown";
}

std::string_view to_string(Join j) {
  switch (j) {
    case Join::inner: return "inner";
    case Join::left: return "left";
    case Join::right: return "right";
    case Join::outer: return "outer";
  }
  return "unknown";
}

std::string_view to_string(AlgebraOp op) {
  switch (op) {
    case AlgebraOp::add: return "add";
    case AlgebraOp::sub: return "sub";
    case AlgebraOp::mul: return "mul";
    case AlgebraOp::maximum: return "maximum";
    case AlgebraOp::minimum: return "minimum";
    case AlgebraOp::cat: return "cat";
  }
  return "unknown";
}

}  // namespace lattice
