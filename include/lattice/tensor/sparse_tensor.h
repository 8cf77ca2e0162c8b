// SparseTensor (C++): a coordinate set (identity, stride, relation cache) plus features.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "lattice/core/array.h"
#include "lattice/tensor/coordinate_set.h"

namespace lattice {

class SparseTensor {
 public:
  SparseTensor() = default;
  // coords (N, 4) int32 (batch, x, y, z); feats (N, C) float on the same device. Validates
  // shapes, dtypes, devices, stride and batch_counts (ValueError / TypeError "[SparseTensor] ...").
  // With `validate`, duplicate coordinate rows raise now instead of at the first op.
  SparseTensor(const Array& coords, const Array& feats, Int3 stride = {1, 1, 1},
               std::optional<std::vector<std::int64_t>> batch_counts = {}, bool validate = false);
  // Features on an existing coordinate set (keeps its key).
  SparseTensor(std::shared_ptr<CoordinateSet> coordinates, const Array& feats);

  const Array& coords() const { return set_->coords(); }
  const Array& feats() const { return feats_; }
  Int3 stride() const { return set_->stride(); }
  std::int64_t size() const { return set_->size(); }
  std::int64_t channels() const { return feats_.dim(1); }
  std::uint64_t key() const { return set_->key(); }
  const std::shared_ptr<CoordinateSet>& coordinate_set() const { return set_; }

  // Same coordinates and key, new features (N, C') .
  SparseTensor with_feats(const Array& feats) const { return SparseTensor(set_, feats); }

 private:
  std::shared_ptr<CoordinateSet> set_;
  Array feats_;
};

}  // namespace lattice
