#include "train/run_device.h"

#include "core/allocator.h"
#include "core/device_backend.h"
#include "core/error.h"
#include "core/stream.h"

namespace roformer {

Device checked_device(Device device, const std::string& key) {
  try {
    require_device(device);
  } catch (const Error& e) {
    throw InputError(key + ": " + device.str() + " cannot be used: " + e.what() +
                     " (set it to cpu)");
  }
  return device;
}

Device device_option(const std::string& text, const std::string& key) {
  Device device;
  try {
    device = parse_device(text);
  } catch (const std::exception&) {
    throw InputError(key + ": expected cpu, cuda or cuda:N, got '" + text + "'");
  }
  return checked_device(device, key);
}

Device run_device(const Config& config) {
  return checked_device(config.run.device, config.source + ": run.device");
}

DeviceMemory device_memory(Device device) {
  constexpr double kMiB = 1024.0 * 1024.0;
  const AllocatorStats s = allocator_for(device).stats();
  DeviceMemory m;
  m.allocated_mb = double(s.allocated_bytes) / kMiB;
  m.reserved_mb = double(s.reserved_bytes()) / kMiB;
  m.peak_allocated_mb = double(s.peak_allocated_bytes) / kMiB;
  m.peak_reserved_mb = double(s.peak_reserved_bytes) / kMiB;
  return m;
}

void reset_device_peak(Device device) {
  allocator_for(device).reset_peak();
}

void release_device_cache(Device device) {
  if (!device.is_cpu()) synchronize(current_stream(device));
  allocator_for(device).release_cached();
}

}  // namespace roformer
