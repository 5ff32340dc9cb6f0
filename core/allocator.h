// Storage allocators, one per device. The CPU allocator is a caching pool:
// a training step frees and re-allocates the same sizes every step, and giving
// large blocks back to the OS makes the next step fault them in again (that
// page-fault work was most of PyTorch's CPU time on a small RoFormer here).
// The CUDA caching allocator (core/cuda/caching_allocator.h) implements the
// same interface; nvcc reads this header, so it stays C++17.
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
  size_t peak_reserved_bytes = 0;
  // Memory held from the system: handed out plus cached.
  size_t reserved_bytes() const { return allocated_bytes + cached_bytes; }
};

// The bin a request of `nbytes` is rounded up to: multiples of `granule` up to
// `small_limit`, then quarter steps between powers of two (at most 25% waste),
// so slightly different requests share blocks.
inline size_t allocation_bin(size_t nbytes, size_t granule, size_t small_limit) {
  if (nbytes == 0) nbytes = 1;
  if (nbytes <= small_limit) return (nbytes + granule - 1) / granule * granule;
  size_t power = small_limit;
  while (power * 2 < nbytes) power *= 2;
  const size_t quarter = power / 4;
  return (nbytes + quarter - 1) / quarter * quarter;
}

// The largest cached block a request binned to `bin` may take: up to a
// quarter more. Requests whose size follows the batch (the masked rows of the
// MLM head, a token stream's length) land in a new bin whenever the count is
// new; reusing a slightly larger block keeps reserved memory from growing
// with every count seen.
inline size_t largest_reusable_block(size_t bin) {
  return bin + bin / 4;
}

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t nbytes) = 0;
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
  virtual AllocatorStats stats() const = 0;
  // Resets both peaks (allocated and reserved) to the current values.
  virtual void reset_peak() = 0;
  // Returns every cached block to the system (the trainer calls this at stage
  // boundaries, where the shapes of the next stage differ). The CPU allocator
  // also trims malloc's heap, so the freed pages leave the process.
  virtual void release_cached() = 0;
  // Tests: while on, every allocation comes back filled with 0xFF bytes (NaN
  // in every float type), so an output element a kernel never writes shows.
  void set_poison(bool on) { poison_ = on; }
  bool poison() const { return poison_; }

 private:
  bool poison_ = false;
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

// The allocator of a device (one per device index). Throws naming the device
// if this build or machine has no such device (e.g. cuda without the backend).
Allocator& allocator_for(Device device);

}  // namespace roformer
