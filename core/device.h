// Where a tensor lives. CPU is always available; CUDA devices exist when the
// build has the CUDA backend and the machine has a GPU.
#pragma once

#include <cstdint>
#include <string>

namespace roformer {

enum class DeviceType : uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;

  static Device cpu() { return {DeviceType::cpu, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::cuda, index}; }
  bool is_cpu() const { return type == DeviceType::cpu; }
  bool is_cuda() const { return type == DeviceType::cuda; }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const {
    return type == DeviceType::cpu ? "cpu" : "cuda:" + std::to_string(index);
  }
};

// Parses "cpu", "cuda", "cuda:N"; throws InputError naming the text otherwise.
Device parse_device(const std::string& text);

}  // namespace roformer
