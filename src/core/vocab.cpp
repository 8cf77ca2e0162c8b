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

}  // namespace lattice
