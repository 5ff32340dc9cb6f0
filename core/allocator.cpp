#include "core/allocator.h"

#include <cstdlib>
#include <new>

#include "core/error.h"

namespace roformer {

namespace {
constexpr size_t kAlignment = 64;
}

CpuCachingAllocator::~CpuCachingAllocator() {
  release_cached();
}

size_t CpuCachingAllocator::bin_size(size_t nbytes) {
  if (nbytes == 0) nbytes = 1;
  if (nbytes <= 4096) return (nbytes + kAlignment - 1) / kAlignment * kAlignment;
  // Quarter steps between powers of two: waste at most 25%.
  size_t power = 4096;
  while (power * 2 < nbytes) power *= 2;
  const size_t quarter = power / 4;
  return (nbytes + quarter - 1) / quarter * quarter;
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
      throw Error(detail::concat("cpu allocator: out of memory allocating ", size, " bytes"));
  }
  stats_.allocated_bytes += size;
  if (stats_.allocated_bytes > stats_.peak_allocated_bytes)
    stats_.peak_allocated_bytes = stats_.allocated_bytes;
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
}

void CpuCachingAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [bin, blocks] : free_blocks_)
    for (void* block : blocks) std::free(block);
  free_blocks_.clear();
  stats_.cached_bytes = 0;
}

namespace {
Allocator* g_cuda_allocator = nullptr;
}

Allocator& allocator_for(Device device) {
  if (device.is_cpu()) {
    // Never destroyed: tensors with static lifetime may outlive any other object.
    static auto* cpu = new CpuCachingAllocator();
    return *cpu;
  }
  if (!g_cuda_allocator)
    throw Error(detail::concat("no allocator for device ", device.str(),
                               ": this build has no CUDA backend or no GPU was found"));
  return *g_cuda_allocator;
}

void register_allocator(DeviceType type, Allocator* allocator) {
  if (type == DeviceType::cuda) g_cuda_allocator = allocator;
}

}  // namespace roformer
