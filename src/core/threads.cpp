#include "lattice/core/threads.h"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "lattice/core/error.h"

namespace lattice {

namespace detail {

int cpus_from_cgroup_v2(std::string_view cpu_max) {
  // "max 100000" (no limit) or "<quota> <period>" in microseconds.
  std::istringstream in{std::string(cpu_max)};
  std::string quota;
  long long period = 0;
  if (!(in >> quota >> period) || quota == "max" || period <= 0) return 0;
  char* end = nullptr;
  const long long q = std::strtoll(quota.c_str(), &end, 10);
  if (end == quota.c_str() || q <= 0) return 0;
  return cpus_from_cgroup_v1(q, period);
}

int cpus_from_cgroup_v1(long long quota_us, long long period_us) {
  if (quota_us <= 0 || period_us <= 0) return 0;  // -1: no limit
  const long long n = (quota_us + period_us - 1) / period_us;  // a partial CPU still needs a thread
  return n < 1 ? 1 : (n > 4096 ? 4096 : static_cast<int>(n));
}

}  // namespace detail

namespace {

std::string read_first_line(const char* path) {
  std::ifstream f(path);
  std::string line;
  if (f) std::getline(f, line);
  return line;
}

std::atomic<CpuCountFn>& cpus_source() {
  static std::atomic<CpuCountFn> fn{nullptr};
  return fn;
}

// CPUs this process may run on: the platform's count (the CPU backend registers the affinity
// mask: taskset, container cpusets; else the hardware threads), capped by a cgroup CPU quota
// (docker --cpus, Kubernetes limits), which hardware_concurrency ignores. More threads than that
// make every OpenMP barrier wait for a descheduled thread (docs/performance.md, "Known problem:
// OpenMP barriers on a busy machine").
int available_cpus() {
  int n = 0;
  if (const CpuCountFn fn = cpus_source().load(std::memory_order_acquire)) n = fn();
  if (n < 1) {
    const unsigned hw = std::thread::hardware_concurrency();
    n = hw ? static_cast<int>(hw) : 1;
  }
  int quota = detail::cpus_from_cgroup_v2(read_first_line("/sys/fs/cgroup/cpu.max"));
  if (quota == 0) {
    const std::string q = read_first_line("/sys/fs/cgroup/cpu/cpu.cfs_quota_us");
    const std::string p = read_first_line("/sys/fs/cgroup/cpu/cpu.cfs_period_us");
    if (!q.empty() && !p.empty()) quota = detail::cpus_from_cgroup_v1(std::atoll(q.c_str()), std::atoll(p.c_str()));
  }
  if (quota > 0 && quota < n) n = quota;
  return n;
}

int default_threads() {
  for (const char* var : {"LATTICE_NUM_THREADS", "OMP_NUM_THREADS"}) {
    if (const char* v = std::getenv(var)) {
      char* end = nullptr;
      const long n = std::strtol(v, &end, 10);
      if (end != v && n >= 1 && n <= 4096) return static_cast<int>(n);
    }
  }
  return available_cpus();
}

std::atomic<int>& setting() {
  static std::atomic<int> n{default_threads()};
  return n;
}

}  // namespace

int num_threads() { return setting().load(std::memory_order_relaxed); }

void set_num_threads(int n) {
  if (n < 1) throw_value_error("set_num_threads", "n", "a thread count >= 1", std::to_string(n));
  setting().store(n, std::memory_order_relaxed);
}

int cpus_available() { return available_cpus(); }

void set_available_cpus_source(CpuCountFn fn) { cpus_source().store(fn, std::memory_order_release); }

}  // namespace lattice
