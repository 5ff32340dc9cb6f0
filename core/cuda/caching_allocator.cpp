#include "core/cuda/caching_allocator.h"

#include <algorithm>

#include "core/error.h"

namespace roformer::cuda {

CachingAllocator::CachingAllocator(int device, std::function<cudaStream_t()> current_stream)
    : device_(device), current_stream_(std::move(current_stream)) {}

CachingAllocator::~CachingAllocator() {
  try {
    release_cached();
  } catch (...) {  // the context may be gone at exit; nothing left to do
  }
}

void CachingAllocator::note_peaks() {
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes());
}

void CachingAllocator::collect_pending() {
  auto ready = [](const Pending& p) {
    return std::all_of(p.events.begin(), p.events.end(),
                       [](const CudaEvent& e) { return e.done(); });
  };
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (ready(*it)) {
      free_[{it->block.stream, it->block.size}].push_back(it->ptr);
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
}

void CachingAllocator::free_cached() {
  for (Pending& p : pending_)
    for (CudaEvent& e : p.events) e.synchronize();
  collect_pending();
  DeviceGuard guard(device_);
  for (auto& [key, blocks] : free_)
    for (void* ptr : blocks) RF_CUDA_CHECK(cudaFree(ptr));
  free_.clear();
  stats_.cached_bytes = 0;
}

void* CachingAllocator::malloc_or_throw(size_t size) {
  DeviceGuard guard(device_);
  void* ptr = nullptr;
  cudaError_t status = cudaMalloc(&ptr, size);
  if (status == cudaErrorMemoryAllocation && stats_.cached_bytes > 0) {
    cudaGetLastError();  // clear the sticky-free error before retrying
    free_cached();
    status = cudaMalloc(&ptr, size);
  }
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    throw Error(detail::concat("cuda:", device_, ": out of memory allocating ", size,
                               " bytes (allocated ", stats_.allocated_bytes, ", cached ",
                               stats_.cached_bytes, ", free on the device ", free_bytes, " of ",
                               total_bytes, ")"));
  }
  RF_CUDA_CHECK(status);
  return ptr;
}

void* CachingAllocator::allocate(size_t nbytes) {
  return allocate_on(nbytes, current_stream_());
}

void* CachingAllocator::allocate_on(size_t nbytes, cudaStream_t stream) {
  const size_t size = bin_size(nbytes);
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.num_allocations;
  if (!pending_.empty()) collect_pending();
  void* ptr = nullptr;
  auto it = free_.find({stream, size});
  if (it != free_.end() && !it->second.empty()) {
    ptr = it->second.back();
    it->second.pop_back();
    stats_.cached_bytes -= size;
    ++stats_.num_cache_hits;
  } else {
    ptr = malloc_or_throw(size);
  }
  live_[ptr] = Block{size, stream, {}};
  stats_.allocated_bytes += size;
  note_peaks();
  if (poison()) {
    DeviceGuard guard(device_);
    RF_CUDA_CHECK(cudaMemsetAsync(ptr, 0xFF, size, stream));
  }
  return ptr;
}

void CachingAllocator::deallocate(void* ptr, size_t /*nbytes*/) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(ptr);
  if (it == live_.end()) return;  // not ours: nothing sane to do in a destructor path
  Block block = std::move(it->second);
  live_.erase(it);
  stats_.allocated_bytes -= block.size;
  stats_.cached_bytes += block.size;
  if (block.other_streams.empty()) {
    free_[{block.stream, block.size}].push_back(ptr);
    return;
  }
  Pending pending{ptr, block, {}};
  try {
    DeviceGuard guard(device_);
    for (cudaStream_t s : block.other_streams) {
      pending.events.push_back(CudaEvent::create());
      pending.events.back().record(s);
    }
    pending_.push_back(std::move(pending));
  } catch (const Error&) {
    // Cannot order the reuse: keep the block out of circulation rather than
    // risk handing it out while another stream still reads it.
    stats_.cached_bytes -= block.size;
  }
}

void CachingAllocator::record_stream(void* ptr, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(ptr);
  RF_CHECK(it != live_.end(), "record_stream: ", ptr, " is not a live block of cuda:", device_);
  Block& block = it->second;
  if (stream == block.stream) return;
  if (std::find(block.other_streams.begin(), block.other_streams.end(), stream) ==
      block.other_streams.end())
    block.other_streams.push_back(stream);
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes();
}

void CachingAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(mutex_);
  free_cached();
}

}  // namespace roformer::cuda
