#include "lattice/tensor/sparse_tensor.h"

#include <string>

#include "lattice/core/error.h"

namespace lattice {

namespace {

void check_feats(const CoordinateSet& set, const Array& feats) {
  constexpr std::string_view op = "SparseTensor";
  if (!feats.defined()) throw_value_error(op, "feats", "an (N, C) float array", "nothing");
  if (!is_floating(feats.dtype()))
    throw_type_error(op, "feats", "float16, bfloat16, float32 or float64",
                     to_string(feats.dtype()));
  if (feats.ndim() != 2 || feats.dim(0) != set.size())
    throw_value_error(op, "feats", "shape (N=" + std::to_string(set.size()) + ", C)",
                      format_shape(feats.shape()));
  if (feats.device() != set.coords().device())
    throw_value_error(op, "feats",
                      "the device of coords (" + to_string(set.coords().device()) + ")",
                      to_string(feats.device()));
}

}  // namespace

SparseTensor::SparseTensor(const Array& coords, const Array& feats, Int3 stride,
                           std::optional<std::vector<std::int64_t>> batch_counts, bool validate)
    : set_(CoordinateSet::create(coords, stride, std::move(batch_counts), validate)),
      feats_(feats) {
  check_feats(*set_, feats_);
}

SparseTensor::SparseTensor(std::shared_ptr<CoordinateSet> coordinates, const Array& feats)
    : set_(std::move(coordinates)), feats_(feats) {
  if (!set_) throw_value_error("SparseTensor", "coordinates", "a coordinate set", "null");
  check_feats(*set_, feats_);
}

}  // namespace lattice
