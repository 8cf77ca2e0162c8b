// The table of measured route choices (lattice/route/tuning.h).
#include "lattice/route/tuning.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <mutex>

namespace lattice {

namespace {

std::mutex g_mutex;
std::map<std::string, TunedChoice> g_table;  // guarded by g_mutex
std::atomic<std::size_t> g_count{0};

// The smallest power of two >= n (0 for n <= 0).
std::int64_t pow2_ceil(std::int64_t n) {
  if (n <= 0) return 0;
  std::int64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

std::string device_part(const Device& device, const DeviceCaps& caps) {
  if (device.is_cuda())
    return "cuda sm_" + std::to_string(caps.cuda.sm) + " '" + caps.cuda.name + "'";
  return "cpu " + caps.cpu.isa + " " + std::to_string(caps.cpu.threads) + " threads";
}

// 64-bit FNV-1a.
void fnv(std::uint64_t& h, std::string_view s) {
  for (const unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  h ^= 0xff;
  h *= 1099511628211ULL;
}

}  // namespace

std::string conv_tuning_key(const ConvProblem& p, const DeviceCaps& caps) {
  return "conv " + std::string(to_string(p.pass)) + ", " + std::string(to_string(p.relation)) + ", " +
         std::string(to_string(p.dtype)) + ", " + device_part(p.device, caps) + ", C_in=" + std::to_string(p.c_in) +
         " C_out=" + std::to_string(p.c_out) + " K=" + std::to_string(p.kernel_volume) +
         " N_in<=" + std::to_string(pow2_ceil(p.n_in)) + " N_out<=" + std::to_string(pow2_ceil(p.n_out)) +
         (p.identity_relation ? ", identity" : "") + (p.deterministic ? "" : ", non-deterministic allowed") +
         (p.allow_tf32 ? ", tf32 allowed" : "");
}

std::vector<RouteId> tuning_candidates(const Explanation& by_rank) {
  std::vector<RouteId> out;
  for (const RouteRow& row : by_rank.rows)
    if (row.verdict.admitted && route_info(row.id).name != "reference") out.push_back(row.id);
  return out;
}

std::optional<TunedChoice> tuned_choice(std::vector<TunedTime> times) {
  const TunedTime* best = nullptr;
  for (const TunedTime& t : times)
    if (t.ms >= 0 && (best == nullptr || t.ms < best->ms)) best = &t;
  if (best == nullptr) return std::nullopt;
  const RouteId route = best->route;
  return TunedChoice{route, std::move(times)};
}

std::string tuning_build_id() {
  static const std::string id = [] {
    std::uint64_t h = 1469598103934665603ULL;
    for (const RouteInfo& r : route_table()) {
      fnv(h, r.family);
      fnv(h, r.name);
      fnv(h, std::to_string(r.rank));
      fnv(h, r.kernels);
      for (const KernelFile& f : r.files) fnv(h, f.constraints);
    }
#if defined(__VERSION__)
    fnv(h, __VERSION__);
#endif
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
    return std::string(hex);
  }();
  return id;
}

void set_tuned(const std::string& key, TunedChoice choice) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_table[key] = std::move(choice);
  g_count.store(g_table.size(), std::memory_order_release);
}

std::optional<TunedChoice> find_tuned(const std::string& key) {
  if (g_count.load(std::memory_order_acquire) == 0) return std::nullopt;
  std::lock_guard<std::mutex> lock(g_mutex);
  const auto it = g_table.find(key);
  if (it == g_table.end()) return std::nullopt;
  return it->second;
}

std::vector<std::pair<std::string, TunedChoice>> tuned_entries() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return {g_table.begin(), g_table.end()};
}

void clear_tuned() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_table.clear();
  g_count.store(0, std::memory_order_release);
}

std::size_t tuned_count() { return g_count.load(std::memory_order_acquire); }

}  // namespace lattice
