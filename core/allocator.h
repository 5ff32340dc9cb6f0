// Storage allocators, one per device. The CPU allocator is a caching pool:
// a training step frees and re-allocates the same sizes every step, and giving
// large blocks back to the OS makes the next step fault them in again (that
// page-fault work was most of PyTorch's CPU time on a small RoFormer here).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "core/device.h"

namespace roformer {

struct AllocatorStats {
  size_t allocated_bytes = 0;  // handed out and not yet returned
  size_t cached_bytes = 0;     // returned and kept for reuse
  size_t peak_allocated_bytes = 0;
  size_t num_allocations = 0;  // calls to allocate()
  size_t num_cache_hits = 0;   // served from the cache
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t nbytes) = 0;
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
  virtual AllocatorStats stats() const = 0;
  virtual void reset_peak() = 0;
  // Returns every cached block to the system.
  virtual void release_cached() = 0;
};

// 64-byte aligned, size-binned blocks kept for reuse. Sizes are rounded up to
// a bin (multiples of 64 bytes below 4 KiB, then quarter powers of two) so that
// slightly different requests share blocks.
class CpuCachingAllocator final : public Allocator {
 public:
  ~CpuCachingAllocator() override;
  void* allocate(size_t nbytes) override;
  void deallocate(void* ptr, size_t nbytes) override;
  AllocatorStats stats() const override;
  void reset_peak() override;
  void release_cached() override;

  static size_t bin_size(size_t nbytes);

 private:
  mutable std::mutex mutex_;
  std::map<size_t, std::vector<void*>> free_blocks_;  // bin size -> blocks
  AllocatorStats stats_;
};

// The allocator of a device. Throws if the device has no allocator in this
// build (e.g. cuda without the CUDA backend).
Allocator& allocator_for(Device device);

// Lets a backend (core/cuda) install the allocator for its device type.
void register_allocator(DeviceType type, Allocator* allocator);

}  // namespace roformer
