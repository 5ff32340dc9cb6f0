#include "core/cuda/segment_arena.h"

#include "core/error.h"

namespace roformer::cuda {

uintptr_t SegmentArena::segment_of(uintptr_t address) const {
  auto it = segments_.upper_bound(address);
  RF_CHECK(it != segments_.begin(), "SegmentArena: ", address, " lies in no segment");
  --it;
  RF_CHECK(address < it->first + it->second, "SegmentArena: ", address, " lies in no segment");
  return it->first;
}

void SegmentArena::add_free(uintptr_t address, size_t bytes) {
  free_[address] = bytes;
  free_by_size_.emplace(bytes, address);
}

void SegmentArena::remove_free(std::map<uintptr_t, size_t>::iterator it) {
  auto [lo, hi] = free_by_size_.equal_range(it->second);
  for (auto s = lo; s != hi; ++s) {
    if (s->second == it->first) {
      free_by_size_.erase(s);
      break;
    }
  }
  free_.erase(it);
}

uintptr_t SegmentArena::take(size_t bytes) {
  auto fit = free_by_size_.lower_bound(bytes);
  if (fit == free_by_size_.end()) return 0;
  const uintptr_t address = fit->second;
  const size_t range = fit->first;
  remove_free(free_.find(address));
  if (range > bytes) add_free(address + bytes, range - bytes);
  return address;
}

void SegmentArena::add_segment(uintptr_t base) {
  RF_CHECK(base != 0, "SegmentArena: a segment needs a base address (got 0)");
  RF_CHECK(segments_.find(base) == segments_.end(), "SegmentArena: a segment at ", base,
           " is already held");
  segments_[base] = kSegmentBytes;
  add_free(base, kSegmentBytes);
}

void SegmentArena::give_back(uintptr_t address, size_t bytes) {
  const uintptr_t segment = segment_of(address);
  uintptr_t start = address;
  size_t size = bytes;
  // The free range right after, if it is in the same segment.
  auto next = free_.find(address + bytes);
  if (next != free_.end() && segment_of(next->first) == segment) {
    size += next->second;
    remove_free(next);
  }
  // The free range right before, likewise.
  auto prev = free_.lower_bound(address);
  if (prev != free_.begin()) {
    --prev;
    if (prev->first + prev->second == address && segment_of(prev->first) == segment) {
      start = prev->first;
      size += prev->second;
      remove_free(prev);
    }
  }
  add_free(start, size);
}

std::vector<uintptr_t> SegmentArena::release_empty() {
  std::vector<uintptr_t> released;
  for (auto it = segments_.begin(); it != segments_.end();) {
    auto range = free_.find(it->first);
    if (range != free_.end() && range->second == it->second) {
      remove_free(range);
      released.push_back(it->first);
      it = segments_.erase(it);
    } else {
      ++it;
    }
  }
  return released;
}

size_t SegmentArena::free_bytes() const {
  size_t total = 0;
  for (const auto& [address, bytes] : free_) total += bytes;
  return total;
}

}  // namespace roformer::cuda
