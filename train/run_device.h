// The device a command runs its model on (run.device, or --device of predict
// and evaluate), checked before anything is built, so a run that cannot use
// it fails at once with the key and the reason. Also the device side of the
// trainer's bookkeeping: its allocator's memory and the release of cached
// blocks at stage boundaries.
#pragma once

#include <string>

#include "core/device.h"
#include "train/config.h"

namespace roformer {

// `device` when ops can run on it here; otherwise throws InputError
// "<key>: cuda:0 cannot be used: <why> (set it to cpu)", where <why> is the
// build lacking a CUDA backend or CUDA kernels, or no such GPU being visible.
Device checked_device(Device device, const std::string& key);

// The text of a command-line option ("cpu", "cuda", "cuda:1"), parsed and
// checked, errors naming `key` ("--device").
Device device_option(const std::string& text, const std::string& key);

// checked_device(config.run.device, "<config file>: run.device").
Device run_device(const Config& config);

// A device allocator's memory in MiB (for the CPU: the host caching pool).
struct DeviceMemory {
  double allocated_mb = 0, reserved_mb = 0, peak_allocated_mb = 0, peak_reserved_mb = 0;
};
DeviceMemory device_memory(Device device);
void reset_device_peak(Device device);
// Gives the device allocator's cached blocks back (stage boundaries: the next
// stage's shapes differ). Waits for the device's pending work first.
void release_device_cache(Device device);

}  // namespace roformer
