// The caching allocator's small pool (core/cuda/segment_arena.h): pure
// bookkeeping over addresses, so these run without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "core/cuda/segment_arena.h"
#include "core/error.h"

namespace roformer::cuda {
namespace {

constexpr size_t kSeg = SegmentArena::kSegmentBytes;
constexpr uintptr_t kBase = uintptr_t(1) << 40;

TEST(SegmentArena, CarvesBestFitAndMergesNeighboursBack) {
  SegmentArena arena;
  EXPECT_EQ(arena.take(512), 0u);  // no segment yet
  arena.add_segment(kBase);
  const uintptr_t a = arena.take(4096), b = arena.take(8192), c = arena.take(4096);
  EXPECT_EQ(a, kBase);
  EXPECT_EQ(b, kBase + 4096);
  EXPECT_EQ(c, kBase + 12288);
  arena.give_back(a, 4096);
  arena.give_back(c, 4096);  // merges with the rest of the segment
  EXPECT_EQ(arena.free_bytes(), kSeg - 8192);
  // Best fit: the 4096-byte hole at the start, not the large tail.
  EXPECT_EQ(arena.take(3584), kBase);
  arena.give_back(kBase, 3584);
  arena.give_back(b, 8192);  // everything merges into one range again
  EXPECT_EQ(arena.take(kSeg), kBase);
  EXPECT_EQ(arena.take(512), 0u);
  arena.give_back(kBase, kSeg);
  EXPECT_EQ(arena.release_empty(), std::vector<uintptr_t>{kBase});
  EXPECT_EQ(arena.segments(), 0u);
}

TEST(SegmentArena, NeverMergesAcrossAdjacentSegments) {
  SegmentArena arena;
  arena.add_segment(kBase);
  arena.add_segment(kBase + kSeg);  // right after the first in memory
  const uintptr_t first = arena.take(kSeg), second = arena.take(kSeg);
  EXPECT_NE(first, 0u);
  EXPECT_NE(second, 0u);
  arena.give_back(first, kSeg);
  arena.give_back(second, kSeg);
  // Two whole free segments, not one range over both: nothing larger than one fits.
  EXPECT_EQ(arena.take(kSeg + 512), 0u);
  arena.add_segment(kBase + 4 * kSeg);
  const uintptr_t held = arena.take(1024);  // best fit among three equal ranges
  const std::vector<uintptr_t> released = arena.release_empty();
  EXPECT_EQ(released.size(), 2u);  // the segment holding `held` stays
  EXPECT_EQ(std::count(released.begin(), released.end(), held), 0);
  EXPECT_EQ(arena.segments(), 1u);
  const std::string bad = [&] {
    try {
      arena.give_back(kBase + 100 * kSeg, 512);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  }();
  EXPECT_NE(bad.find("lies in no segment"), std::string::npos) << bad;
}

// Sizes that change every step, as the masked rows do: once the segments hold
// the live peak, no new segment is needed, and everything merges back.
TEST(SegmentArena, VaryingSizesReuseTheSegmentsHeld) {
  SegmentArena arena;
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> rows(560, 680);
  size_t segments_after_warmup = 0;
  for (int step = 0; step < 200; ++step) {
    const size_t bytes = SegmentArena::piece_size(size_t(rows(rng)) * 1024);
    std::vector<uintptr_t> live;
    for (int i = 0; i < 5; ++i) {
      uintptr_t p = arena.take(bytes);
      if (p == 0) {
        arena.add_segment(kBase + arena.segments() * 4 * kSeg);
        p = arena.take(bytes);
      }
      ASSERT_NE(p, 0u);
      live.push_back(p);
    }
    for (uintptr_t p : live) arena.give_back(p, bytes);
    if (step == 5) segments_after_warmup = arena.segments();
  }
  EXPECT_EQ(arena.segments(), segments_after_warmup);
  EXPECT_EQ(arena.free_bytes(), arena.segments() * kSeg);
}

TEST(SegmentArena, PiecesAreWholeGranules) {
  EXPECT_EQ(SegmentArena::piece_size(0), 512u);
  EXPECT_EQ(SegmentArena::piece_size(1), 512u);
  EXPECT_EQ(SegmentArena::piece_size(512), 512u);
  EXPECT_EQ(SegmentArena::piece_size(513), 1024u);
}

}  // namespace
}  // namespace roformer::cuda
