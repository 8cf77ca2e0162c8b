// CoordinateSet: one registered set of coordinates with its identity key, its lazily built
// coordinate index and the cache of relations that start from it.
//
// The coordinate manager is distributed over the sets: each set owns the relations whose input
// it is, so a cached relation lives exactly as long as its input coordinates (no global
// registry that leaks or goes stale). A relation onto a target refers to the target only by
// key; a relation that generates its output owns the generated set.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <tuple>
#include <vector>

#include "lattice/core/array.h"
#include "lattice/core/vocab.h"

namespace lattice {

class Relation;
class CoordIndex;

class CoordinateSet : public std::enable_shared_from_this<CoordinateSet> {
 public:
  // coords: (N, 4) int32 rows (batch, x, y, z), logical lattice indices at `stride`.
  // The array is made contiguous and kept (not copied when already contiguous; never mutated).
  // `op` names the caller in validation errors. With `validate`, duplicate rows raise now;
  // otherwise they raise the first time an op builds the index.
  static std::shared_ptr<CoordinateSet> create(const Array& coords, Int3 stride,
                                               std::optional<std::vector<std::int64_t>> batch_counts = {},
                                               bool validate = false, std::string_view op = "SparseTensor");
  ~CoordinateSet();

  std::uint64_t key() const { return key_; }  // unique per process, never reused
  const Array& coords() const { return coords_; }
  std::int64_t size() const { return coords_.dim(0); }
  Int3 stride() const { return stride_; }
  const std::optional<std::vector<std::int64_t>>& batch_counts() const { return batch_counts_; }

  // The coordinate -> row index (built on first use; raises ValueError naming `op` on
  // duplicate rows).
  const CoordIndex& index(std::string_view op) const;
  // Row of a coordinate, or -1.
  std::int64_t lookup(std::int32_t b, std::int32_t x, std::int32_t y, std::int32_t z,
                      std::string_view op = "lookup") const;

  struct RelationResult {
    std::shared_ptr<const Relation> relation;
    std::shared_ptr<CoordinateSet> output;  // the output support (this set, the target or generated)
  };
  // Builds or fetches the relation of `kind` from this set (cached by kind, spec, target key).
  // `target` is required for RelationKind::target and transposed_target, ignored otherwise.
  RelationResult relation(RelationKind kind, const KernelSpec& spec,
                          const std::shared_ptr<CoordinateSet>& target, std::string_view op);

  std::size_t cached_relation_count() const;
  // How many relations this set's cache got by transposing a cached forward relation instead of
  // hashing (a transposed conv onto the input of the strided conv that made this set).
  std::size_t transposed_relation_count() const;

 private:
  CoordinateSet() = default;

  std::uint64_t key_ = 0;
  Array coords_;
  Int3 stride_{1, 1, 1};
  std::optional<std::vector<std::int64_t>> batch_counts_;

  mutable std::mutex mutex_;
  mutable std::shared_ptr<const CoordIndex> index_;
  using CacheKey = std::tuple<int, KernelSpec, std::uint64_t>;  // kind, spec, target key (0 = none)
  std::map<CacheKey, RelationResult> relations_;  // output == this set is stored as nullptr
  std::size_t transposed_ = 0;

  // The cached forward or target relation with `spec` (either expand) from this set onto
  // `output`, or null.
  std::shared_ptr<const Relation> cached_relation_onto(const CoordinateSet& output, const KernelSpec& spec) const;
};

}  // namespace lattice
