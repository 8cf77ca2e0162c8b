#include "lattice/core/stream.h"

#include <unordered_map>

namespace lattice {

namespace {
std::unordered_map<int, std::uintptr_t>& streams() {
  thread_local std::unordered_map<int, std::uintptr_t> s;
  return s;
}
}  // namespace

void set_current_stream(Device device, std::uintptr_t stream) {
  if (!device.is_cuda()) return;
  streams()[device.index] = stream;
}

std::uintptr_t current_stream(Device device) {
  if (!device.is_cuda()) return 0;
  auto& s = streams();
  auto it = s.find(device.index);
  return it == s.end() ? 0 : it->second;
}

}  // namespace lattice
