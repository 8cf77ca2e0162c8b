#include "lattice/core/threads.h"

#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>

#include "lattice/core/error.h"

namespace lattice {

namespace {

int default_threads() {
  for (const char* var : {"LATTICE_NUM_THREADS", "OMP_NUM_THREADS"}) {
    if (const char* v = std::getenv(var)) {
      char* end = nullptr;
      const long n = std::strtol(v, &end, 10);
      if (end != v && n >= 1 && n <= 4096) return static_cast<int>(n);
    }
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return hw ? static_cast<int>(hw) : 1;
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

}  // namespace lattice
