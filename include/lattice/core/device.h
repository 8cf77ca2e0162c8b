// Where an Array's storage lives.
#pragma once

#include <string>

namespace lattice {

enum class DeviceType { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;

  static Device cpu() { return {}; }
  static Device cuda(int index = 0) { return {DeviceType::cuda, index}; }
  bool is_cpu() const { return type == DeviceType::cpu; }
  bool is_cuda() const { return type == DeviceType::cuda; }
  friend bool operator==(const Device&, const Device&) = default;
};

// "cpu" or "cuda:N".
std::string to_string(Device device);

}  // namespace lattice
