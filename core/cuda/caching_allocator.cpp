#include "core/cuda/caching_allocator.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <string>

#include "core/error.h"

namespace roformer::cuda {

namespace {
// An environment switch: unset or empty gives `fallback`, "0" off, else on.
bool env_flag(const char* name, bool fallback) {
  const char* env = std::getenv(name);
  if (!env || !*env) return fallback;
  return std::string(env) != "0";
}
// ROFORMER_CUDA_ALLOC_LOG=1: every new block on stderr (why reserved memory grew).
bool log_new_blocks() {
  static const bool on = env_flag("ROFORMER_CUDA_ALLOC_LOG", false);
  return on;
}
// ROFORMER_CUDA_ALLOC_SEGMENTS=0: small requests get blocks of their own
// (gpu_check's memcheck step: an overrun into a neighbouring piece of a
// segment would go unseen).
bool use_segments() {
  static const bool on = env_flag("ROFORMER_CUDA_ALLOC_SEGMENTS", true);
  return on;
}
}  // namespace

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
      cache(it->ptr, it->block);
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
}

void CachingAllocator::cache(void* ptr, const Block& block) {
  if (block.small) {
    small_.at(block.stream).give_back(reinterpret_cast<uintptr_t>(ptr), block.size);
  } else {
    free_[{block.stream, block.size}].push_back(ptr);
  }
}

void CachingAllocator::free_cached() {
  for (Pending& p : pending_)
    for (CudaEvent& e : p.events) e.synchronize();
  collect_pending();
  DeviceGuard guard(device_);
  for (auto& [key, blocks] : free_) {
    for (void* ptr : blocks) {
      RF_CUDA_CHECK(cudaFree(ptr));
      stats_.cached_bytes -= key.second;
    }
  }
  free_.clear();
  // Segments with a live piece stay (their free part stays cached).
  for (auto it = small_.begin(); it != small_.end();) {
    for (uintptr_t base : it->second.release_empty()) {
      RF_CUDA_CHECK(cudaFree(reinterpret_cast<void*>(base)));
      stats_.cached_bytes -= SegmentArena::kSegmentBytes;
    }
    it = it->second.segments() == 0 ? small_.erase(it) : std::next(it);
  }
}

void* CachingAllocator::take_small(size_t size, cudaStream_t stream) {
  SegmentArena& arena = small_[stream];
  uintptr_t address = arena.take(size);
  if (address != 0) {
    ++stats_.num_cache_hits;
  } else {
    if (log_new_blocks())
      std::fprintf(stderr,
                   "cuda:%d allocator: new %zu-byte segment for %zu on stream %p (reserved %zu, "
                   "allocated %zu, %zu segments with %zu bytes free)\n",
                   device_, SegmentArena::kSegmentBytes, size, static_cast<void*>(stream),
                   stats_.reserved_bytes(), stats_.allocated_bytes, arena.segments(),
                   arena.free_bytes());
    void* segment = malloc_or_throw(SegmentArena::kSegmentBytes);
    // malloc_or_throw may have released every empty segment: look the arena up again.
    SegmentArena& fresh = small_[stream];
    fresh.add_segment(reinterpret_cast<uintptr_t>(segment));
    stats_.cached_bytes += SegmentArena::kSegmentBytes;
    address = fresh.take(size);
  }
  stats_.cached_bytes -= size;
  return reinterpret_cast<void*>(address);
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
    throw OutOfMemoryError(detail::concat("cuda:", device_, ": out of memory allocating ", size,
                                          " bytes (allocated ", stats_.allocated_bytes, ", cached ",
                                          stats_.cached_bytes, ", free on the device ", free_bytes,
                                          " of ", total_bytes, ")"));
  }
  RF_CUDA_CHECK(status);
  return ptr;
}

void* CachingAllocator::allocate(size_t nbytes) {
  return allocate_on(nbytes, current_stream_());
}

void* CachingAllocator::allocate_on(size_t nbytes, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.num_allocations;
  if (!pending_.empty()) collect_pending();
  if (nbytes <= SegmentArena::kSmallLimit && use_segments()) {
    const size_t size = SegmentArena::piece_size(nbytes);
    return hand_out(take_small(size, stream), Block{size, stream, {}, true});
  }
  const size_t size = bin_size(nbytes);
  void* ptr = nullptr;
  size_t block_size = size;
  // The smallest cached block of this stream that fits (lists are erased
  // when emptied, so the first key at or above the bin is the best fit).
  auto it = free_.lower_bound({stream, size});
  if (it != free_.end() && it->first.first == stream &&
      it->first.second <= largest_reusable_block(size)) {
    block_size = it->first.second;
    ptr = it->second.back();
    it->second.pop_back();
    if (it->second.empty()) free_.erase(it);
    stats_.cached_bytes -= block_size;
    ++stats_.num_cache_hits;
  } else {
    if (log_new_blocks()) {
      const bool has_larger = it != free_.end() && it->first.first == stream;
      std::fprintf(stderr,
                   "cuda:%d allocator: new block of %zu bytes for %zu on stream %p (reserved "
                   "%zu, allocated %zu, %zu pending; smallest larger cached block: %zu)\n",
                   device_, size, nbytes, static_cast<void*>(stream), stats_.reserved_bytes(),
                   stats_.allocated_bytes, pending_.size(), has_larger ? it->first.second : 0);
    }
    ptr = malloc_or_throw(size);
  }
  return hand_out(ptr, Block{block_size, stream, {}});
}

void* CachingAllocator::hand_out(void* ptr, Block block) {
  const size_t size = block.size;
  const cudaStream_t stream = block.stream;
  live_[ptr] = std::move(block);
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
    cache(ptr, block);
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
