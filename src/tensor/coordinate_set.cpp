// CoordinateSet: validation of user coordinates, identity keys, the lazily built index and the
// per-set relation cache.
#include "lattice/tensor/coordinate_set.h"

#include <atomic>
#include <string>
#include <utility>

#include "lattice/core/error.h"
#include "lattice/tensor/relation.h"
#include "tensor/coord_index.h"

namespace lattice {

namespace {

// Keys start at 1 (0 means "no target" in relation cache keys) and are never reused.
std::atomic<std::uint64_t> g_next_key{1};

void validate_coords(const Array& coords, std::string_view op) {
  if (!coords.defined()) {
    throw_value_error(op, "coords", "an (N, 4) int32 array", "an undefined array");
  }
  if (!coords.device().is_cpu() && !coords.device().is_cuda()) {
    throw_value_error(op, "coords", "a CPU or CUDA array", to_string(coords.device()));
  }
  if (coords.device().is_cuda() && !backend::device_caps().cuda.built) {
    const std::string device = to_string(coords.device());
    throw UnsupportedError("[" + std::string(op) + "] coords: expected cpu coordinates (" + device +
                           " needs the CUDA backend), got " + device + " (built without CUDA)");
  }
  if (coords.dtype() != Dtype::i32) {
    throw_type_error(op, "coords", "int32 coordinates", std::string(to_string(coords.dtype())));
  }
  if (coords.ndim() != 2 || coords.dim(1) != 4) {
    throw_value_error(op, "coords", "shape (N, 4)", format_shape(coords.shape()));
  }
  if (coords.dim(0) > geometry::kInt32Max) {
    throw_value_error(op, "coords", "fewer than 2^31 rows",
                      std::to_string(coords.dim(0)) + " rows");
  }
}

void validate_stride(const Int3& stride, std::string_view op) {
  for (std::int32_t s : stride) {
    if (s < 1) throw_value_error(op, "stride", "positive integers", to_string(stride));
  }
}

// coords is contiguous and already validated.
void validate_batch_counts(const Array& coords, const std::vector<std::int64_t>& counts,
                           std::string_view op) {
  const std::int64_t n = coords.dim(0);
  const auto n_batches = static_cast<std::int64_t>(counts.size());
  std::int64_t total = 0;
  bool above_n = false;
  for (std::int64_t b = 0; b < n_batches; ++b) {
    const std::int64_t c = counts[b];
    if (c < 0) {
      throw_value_error(op, "batch_counts", "non-negative counts",
                        std::to_string(c) + " at batch " + std::to_string(b));
    }
    if (c > n - total) above_n = true;  // also guards the int64 sum against overflow
    if (!above_n) total += c;
  }
  if (above_n || total != n) {
    throw_value_error(op, "batch_counts", "counts summing to N = " + std::to_string(n),
                      above_n ? std::string("a sum above N") : "sum " + std::to_string(total));
  }

  auto throw_bad_batch = [&](std::int32_t b, std::int64_t r) {
    throw_value_error(op, "coords",
                      "batch ids in [0, " + std::to_string(n_batches) + ") (len(batch_counts))",
                      "batch id " + std::to_string(b) + " at row " + std::to_string(r));
  };
  std::vector<std::int64_t> seen(counts.size(), 0);
  {
    // Counted by the relation route on the coordinates' device; the smallest row with a bad batch
    // id is the one reported.
    backend::BatchHistogram h = relation_kernels(index_problem(coords, op)).batch_histogram(coords, n_batches);
    if (h.bad_row >= 0) throw_bad_batch(h.bad_batch, h.bad_row);
    seen = std::move(h.counts);
  }
  for (std::int64_t b = 0; b < n_batches; ++b) {
    if (seen[b] != counts[b]) {
      throw_value_error(op, "batch_counts",
                        "batch_counts[" + std::to_string(b) + "] == " + std::to_string(seen[b]) +
                            " (the rows of batch " + std::to_string(b) + " in coords)",
                        std::to_string(counts[b]));
    }
  }
}

bool needs_target(RelationKind kind) {
  return kind == RelationKind::target || kind == RelationKind::transposed_target;
}

}  // namespace

std::shared_ptr<CoordinateSet> CoordinateSet::create(
    const Array& coords, Int3 stride, std::optional<std::vector<std::int64_t>> batch_counts,
    bool validate, std::string_view op) {
  validate_coords(coords, op);
  validate_stride(stride, op);
  Array contiguous = coords.contiguous();
  if (batch_counts) validate_batch_counts(contiguous, *batch_counts, op);

  auto set = std::shared_ptr<CoordinateSet>(new CoordinateSet());
  set->key_ = g_next_key.fetch_add(1, std::memory_order_relaxed);
  set->coords_ = std::move(contiguous);
  set->stride_ = stride;
  set->batch_counts_ = std::move(batch_counts);
  if (validate) set->index(op);
  return set;
}

CoordinateSet::~CoordinateSet() = default;

const CoordIndex& CoordinateSet::index(std::string_view op) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!index_) index_ = CoordIndex::build(coords_, op);
  return *index_;
}

std::int64_t CoordinateSet::lookup(std::int32_t b, std::int32_t x, std::int32_t y, std::int32_t z,
                                   std::string_view op) const {
  return index(op).find(geometry::Coord4{b, x, y, z});
}

CoordinateSet::RelationResult CoordinateSet::relation(RelationKind kind, const KernelSpec& spec,
                                                      const std::shared_ptr<CoordinateSet>& target,
                                                      std::string_view op) {
  const bool onto_target = needs_target(kind);
  if (onto_target && !target) {
    throw_value_error(op, "target",
                      "a target coordinate set for a " + std::string(to_string(kind)) + " relation",
                      "none");
  }
  const CacheKey cache_key{static_cast<int>(kind), spec, onto_target ? target->key() : 0};

  // The cache holds the generated output only: a target is referred to by key (keeping it
  // alive from here could form a cycle through its own cache) and this set is stored as null.
  auto resolve = [&](const RelationResult& cached) {
    RelationResult result{cached.relation, cached.output};
    if (onto_target) {
      result.output = target;
    } else if (!result.output) {
      result.output = shared_from_this();
    }
    return result;
  };

  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = relations_.find(cache_key);
    if (it != relations_.end()) return resolve(it->second);
  }

  // A transposed conv onto the set this one was downsampled from (a U-Net's skip): the relation
  // is the transpose of the cached downsampling one, so its edges are not hashed again.
  if (kind == RelationKind::transposed_target && transposes_forward(spec) && target.get() != this) {
    if (std::shared_ptr<const Relation> forward = target->cached_relation_onto(*this, spec)) {
      RelationResult entry{transpose_relation(*forward, kind, op), nullptr};
      std::lock_guard<std::mutex> lock(mutex_);
      auto [it, inserted] = relations_.emplace(cache_key, std::move(entry));
      if (inserted) ++transposed_;
      return resolve(it->second);
    }
  }

  // Built outside the lock: building needs this set's index (which takes the same mutex). When
  // two threads race, the first stored relation wins and both callers get it.
  BuiltRelation built = build_relation(*this, kind, spec, onto_target ? target.get() : nullptr, op);
  RelationResult entry{std::move(built.relation), std::move(built.generated)};
  std::lock_guard<std::mutex> lock(mutex_);
  auto [it, inserted] = relations_.emplace(cache_key, std::move(entry));
  return resolve(it->second);
}

std::shared_ptr<const Relation> CoordinateSet::cached_relation_onto(const CoordinateSet& output,
                                                                    const KernelSpec& spec) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (bool expand : {false, true}) {
    KernelSpec s = spec;
    s.expand = expand;
    auto it = relations_.find(CacheKey{static_cast<int>(RelationKind::forward), s, 0});
    if (it != relations_.end() && it->second.output.get() == &output) return it->second.relation;
    it = relations_.find(CacheKey{static_cast<int>(RelationKind::target), s, output.key()});
    if (it != relations_.end()) return it->second.relation;
  }
  return nullptr;
}

std::size_t CoordinateSet::transposed_relation_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return transposed_;
}

std::size_t CoordinateSet::cached_relation_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return relations_.size();
}

}  // namespace lattice
