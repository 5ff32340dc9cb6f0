#include "core/allocator.h"

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <cstdlib>
#include <cstring>
#include <new>

#include "core/device_backend.h"
#include "core/error.h"

namespace roformer {

namespace {
constexpr size_t kAlignment = 64;
}

CpuCachingAllocator::~CpuCachingAllocator() {
  release_cached();
}

size_t CpuCachingAllocator::bin_size(size_t nbytes) {
  return allocation_bin(nbytes, kAlignment, 4096);
}

void* CpuCachingAllocator::allocate(size_t nbytes) {
  const size_t size = bin_size(nbytes);
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.num_allocations;
  void* ptr = nullptr;
  auto it = free_blocks_.find(size);
  if (it != free_blocks_.end() && !it->second.empty()) {
    ptr = it->second.back();
    it->second.pop_back();
    stats_.cached_bytes -= size;
    ++stats_.num_cache_hits;
  } else {
    ptr = std::aligned_alloc(kAlignment, size);
    if (!ptr && stats_.cached_bytes > 0) {  // out of memory: drop the cache and retry
      for (auto& [bin, blocks] : free_blocks_)
        for (void* block : blocks) std::free(block);
      free_blocks_.clear();
      stats_.cached_bytes = 0;
      ptr = std::aligned_alloc(kAlignment, size);
    }
    if (!ptr)
      throw OutOfMemoryError(
          detail::concat("cpu allocator: out of memory allocating ", size, " bytes"));
  }
  stats_.allocated_bytes += size;
  if (stats_.allocated_bytes > stats_.peak_allocated_bytes)
    stats_.peak_allocated_bytes = stats_.allocated_bytes;
  if (stats_.reserved_bytes() > stats_.peak_reserved_bytes)
    stats_.peak_reserved_bytes = stats_.reserved_bytes();
  if (poison()) std::memset(ptr, 0xFF, size);
  return ptr;
}

void CpuCachingAllocator::deallocate(void* ptr, size_t nbytes) {
  if (!ptr) return;
  const size_t size = bin_size(nbytes);
  std::lock_guard<std::mutex> lock(mutex_);
  free_blocks_[size].push_back(ptr);
  stats_.allocated_bytes -= size;
  stats_.cached_bytes += size;
}

AllocatorStats CpuCachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CpuCachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes();
}

void CpuCachingAllocator::release_cached() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [bin, blocks] : free_blocks_)
      for (void* block : blocks) std::free(block);
    free_blocks_.clear();
    stats_.cached_bytes = 0;
  }
  // Without the trim the freed blocks only move to malloc's free lists (large
  // ones land on its heap once freed mmapped chunks have raised the mmap
  // threshold) and the process keeps them: the six-stage tiny schedule peaked
  // 27% above its largest stage instead of staying at it
  // (docs/performance/cpu.md, "Memory across stages").
#ifdef __GLIBC__
  ::malloc_trim(0);
#endif
}

Allocator& allocator_for(Device device) {
  if (device.is_cpu()) {
    // Never destroyed: tensors with static lifetime may outlive any other object.
    static auto* cpu = new CpuCachingAllocator();
    return *cpu;
  }
  return backend_for(device).allocator(device.index);
}

}  // namespace roformer
