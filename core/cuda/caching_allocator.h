// The CUDA caching allocator: cudaMalloc and cudaFree synchronise the device
// and cost tens of microseconds, and a training step frees and reallocates the
// same sizes every step, so freed blocks are kept and reused.
//
// - Two pools. Requests up to 1 MiB are pieces of 2 MiB segments, carved best
//   fit and merged when freed (segment_arena.h): a size that changes every
//   step (the masked rows of a batch) reuses the segments already held.
//   Larger ones round up to a bin (quarter powers of two) and take a whole
//   cached block of that bin or up to a quarter larger (largest_reusable_block).
// - Stream-ordered: a block belongs to the stream that was current when it was
//   allocated. Freed, it is reused at once by that stream (whose later work is
//   ordered after the earlier use); a block also used on other streams
//   (record_stream) waits for events on them first.
//   Pools are keyed by the stream handle: a stream must not be destroyed while
//   its blocks are cached (release_cached() first), or a new stream given the
//   same handle would reuse them unordered.
// - ROFORMER_CUDA_ALLOC_SEGMENTS=0: no small pool (every request a block of
//   its own), so compute-sanitizer sees an overrun past a small block.
// - Statistics: allocated, cached (reserved = both) and their peaks.
// - release_cached() gives every cached block back (at stage boundaries).
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/allocator.h"
#include "core/cuda/raii.h"
#include "core/cuda/segment_arena.h"

namespace roformer::cuda {

class CachingAllocator final : public Allocator {
 public:
  // `current_stream` names the stream new blocks belong to.
  CachingAllocator(int device, std::function<cudaStream_t()> current_stream);
  ~CachingAllocator() override;
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  void* allocate(size_t nbytes) override;  // on the current stream
  // A block for work on `stream` (kernels' temporaries: freed right after the
  // launch, the block is reused only by later work on that stream).
  void* allocate_on(size_t nbytes, cudaStream_t stream);
  void deallocate(void* ptr, size_t nbytes) override;
  AllocatorStats stats() const override;
  void reset_peak() override;
  void release_cached() override;

  // Declares that work on `stream` uses the block at `ptr` (allocated on
  // another stream): when freed, it is reused only after that work is done.
  void record_stream(void* ptr, cudaStream_t stream);

  static size_t bin_size(size_t nbytes) { return allocation_bin(nbytes, 512, size_t(1) << 20); }

 private:
  struct Block {
    size_t size = 0;
    cudaStream_t stream = nullptr;
    std::vector<cudaStream_t> other_streams;
    bool small = false;  // a piece of a segment of small_[stream]
  };
  struct Pending {  // freed, waiting for work on other streams
    void* ptr;
    Block block;
    std::vector<CudaEvent> events;
  };
  void* malloc_or_throw(size_t size);
  void* take_small(size_t size, cudaStream_t stream);  // caller holds mutex_
  void cache(void* ptr, const Block& block);           // a freed block, reusable now
  void* hand_out(void* ptr, Block block);              // records it live (and poisons it)
  void collect_pending();                              // caller holds mutex_
  void free_cached();                                  // caller holds mutex_
  void note_peaks();

  int device_;
  std::function<cudaStream_t()> current_stream_;
  mutable std::mutex mutex_;
  std::unordered_map<void*, Block> live_;
  std::map<std::pair<cudaStream_t, size_t>, std::vector<void*>> free_;  // large blocks
  std::map<cudaStream_t, SegmentArena> small_;
  std::vector<Pending> pending_;
  AllocatorStats stats_;
};

}  // namespace roformer::cuda
