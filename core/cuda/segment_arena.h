// Small requests carved out of larger segments: the caching allocator's pool
// for blocks up to kSmallLimit. A request whose size follows the batch (the
// MLM head's masked rows: a new count, a new size, most steps) then takes a
// piece of a segment already held instead of a new cudaMalloc, so reserved
// memory grows only when the live small blocks outgrow the segments.
//
// Pure bookkeeping over addresses (no CUDA calls): the caller allocates each
// segment and frees what release_empty() returns. Best fit over the free
// ranges; a range given back merges with its free neighbours of the same
// segment (two segments may be adjacent in memory but are never merged: each
// is freed whole). One arena per stream keeps the allocator stream-ordered.
// Shared with nvcc: C++17.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

namespace roformer::cuda {

class SegmentArena {
 public:
  static constexpr size_t kSmallLimit = size_t(1) << 20;  // requests up to 1 MiB
  static constexpr size_t kSegmentBytes = size_t(2) << 20;
  static constexpr size_t kGranule = 512;

  // A request's size in the arena: a multiple of kGranule.
  static size_t piece_size(size_t nbytes) {
    return ((nbytes == 0 ? 1 : nbytes) + kGranule - 1) / kGranule * kGranule;
  }

  // The address of a free piece of `bytes` (from piece_size), or 0 when no
  // free range is large enough (then add a segment and ask again).
  uintptr_t take(size_t bytes);
  // A segment of kSegmentBytes at `base`, all free.
  void add_segment(uintptr_t base);
  // A piece from take() back to the free ranges.
  void give_back(uintptr_t address, size_t bytes);
  // Segments with nothing taken: removed from the arena, for the caller to free.
  std::vector<uintptr_t> release_empty();

  size_t segments() const { return segments_.size(); }
  size_t free_bytes() const;

 private:
  void add_free(uintptr_t address, size_t bytes);
  void remove_free(std::map<uintptr_t, size_t>::iterator it);
  uintptr_t segment_of(uintptr_t address) const;

  std::map<uintptr_t, size_t> segments_;           // base -> bytes
  std::map<uintptr_t, size_t> free_;               // free range start -> bytes
  std::multimap<size_t, uintptr_t> free_by_size_;  // the same ranges, for best fit
};

}  // namespace roformer::cuda
