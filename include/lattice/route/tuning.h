// Measured route choices (issue 19, "a tuner that never crashes and is never silent").
//
// The route tables rank their routes by a fixed preference; for some problems a lower-ranked
// admitted route is faster on a given machine (cuBLAS per-offset GEMMs against the implicit GEMM
// at large channel counts, say). A tuning run (ops::set_conv_tuning, lattice.tune in Python) times
// every admitted candidate of a conv pass once per bucket of similar problems and records the
// fastest here; from then on explain() / select() choose the recorded route for every problem of
// that bucket while it stays admitted, and explain() prints the measurement. Nothing is recorded
// unless a tuning run asked for it, so an untuned process decides by rank alone, as before.
//
// The table is the process's; saving and loading it (a JSON file per build, under the user's
// cache folder) is the Python layer's job (lattice/tuning.py). Thread-safe; the hot path reads
// one atomic counter while the table is empty.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lattice/route/caps.h"
#include "lattice/route/problem.h"
#include "lattice/route/route.h"

namespace lattice {

// One timed candidate: the median milliseconds of the timed runs, or, when the route threw,
// ms < 0 and the error's message (a failed candidate is never chosen).
struct TunedTime {
  RouteId route;
  double ms = -1.0;
  std::string error;
};

// The decision for one bucket: the route chosen and every candidate's measurement, in rank order.
struct TunedChoice {
  RouteId route;
  std::vector<TunedTime> times;
};

// The tuning bucket of a conv problem: the pass, relation kind, dtype, device (CPU: ISA and
// thread count; CUDA: device name and sm), channel counts, kernel volume, identity flag,
// deterministic / allow_tf32, and the row counts rounded up to powers of two. Problems of one
// bucket share a decision. A printable, stable string (also the key of the saved file).
std::string conv_tuning_key(const ConvProblem& problem, const DeviceCaps& caps);

// The routes a tuning run times, in rank order: the admitted rows of `by_rank` (an explanation
// made without recorded choices), except the reference routes (oracles, never candidates).
std::vector<RouteId> tuning_candidates(const Explanation& by_rank);

// The choice a tuning run records from its measurements (in rank order): the fastest candidate
// that did not fail, a tie keeping the earlier (better-ranked) one; nullopt when none succeeded.
std::optional<TunedChoice> tuned_choice(std::vector<TunedTime> times);

// What identifies this build's routes for a saved table: the version, a hash of the route table
// (every row's family, name, rank, kernels and constraints) and the compiler. A table saved by
// another build is not loaded (its measurements may not hold).
std::string tuning_build_id();

// The process-wide table.
void set_tuned(const std::string& key, TunedChoice choice);
std::optional<TunedChoice> find_tuned(const std::string& key);
std::vector<std::pair<std::string, TunedChoice>> tuned_entries();  // sorted by key
void clear_tuned();
std::size_t tuned_count();

}  // namespace lattice
