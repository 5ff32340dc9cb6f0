// How many splits the fused attention backward cuts each sequence's key
// tiles into (flash_attention_backward.cu; set_flash_backward_splits in
// flash_attention.h forces a count). Host-only arithmetic (C++17), tested
// without a GPU (tests/cuda/test_flash_backward_splits.cpp).
//
// The grid is sequences x heads x splits blocks, one block an SM at a time
// (the kernels' shared memory); a block takes every splits-th key tile of
// its sequence and streams all its query tiles past each. With more than
// one split, each split sums its dq into an f32 slice the size of dq, and
// one more kernel adds the slices.
//
// The first rule (legacy_backward_splits) asked for blocks enough for two
// an SM. On an H200 (session 20) the wgmma backward fell from 237.7 TFLOP/s
// at S = 1536 to 196.8 at 4096 and 202.8 at 16384 (32,768 tokens, 12
// heads), where that rule leaves the last wave of blocks mostly empty: at
// 4096, 3 splits make 288 blocks over 132 SMs, three waves of up to 11 key
// tiles, where 4 splits make three waves of 8. The rule now models a count's
// time (backward_split_seconds) and keeps the first rule's count unless
// another is more than 2% faster by the model. Where the model is wrong,
// attention_bench's ours-*-legacysplits rows show it beside the default.
#pragma once

#include <algorithm>
#include <cstdint>

namespace roformer::kernels::cuda {

// The backward's grid, as the split count sees it.
struct BackwardSplitProblem {
  int64_t per_split = 1;    // blocks a split: sequences x heads
  int64_t key_tiles = 1;    // of 128 keys, in the longest sequence
  int64_t query_rows = 1;   // of the longest sequence (the rows a key tile meets); 0: unknown
  int64_t dq_elements = 0;  // of dq: all query rows x heads x the head dim
  int64_t sms = 1;          // blocks at a time (one an SM)
};

// Splits at most, chosen automatically (each adds a slice of f32 dq sums).
constexpr int64_t kMaxAutoBackwardSplits = 16;

// The model's device: the fused backward's products per SM (about 240
// TFLOP/s over 132 SMs, as an H100 and an H200 ran it) and memory
// bandwidth (below either GPU's). Only their ratio moves the choice.
constexpr double kBackwardFlopsPerSm = 1.8e12;
constexpr double kBackwardBytesPerSecond = 3.0e12;

// The first rule: blocks for two an SM, at most 8 splits and the key tiles.
inline int64_t legacy_backward_splits(const BackwardSplitProblem& p) {
  const int64_t cap = std::min<int64_t>(std::max<int64_t>(p.key_tiles, 1), 8);
  const int64_t per_split = std::max<int64_t>(p.per_split, 1);
  return std::clamp<int64_t>((2 * p.sms + per_split - 1) / per_split, 1, cap);
}

// The modelled seconds of the backward with `splits`: waves of blocks x the
// longest block's key tiles (five products of 128 keys by the query rows,
// head dim 64) on one SM, plus, with splits, the slices' sums written and
// read back by the adding kernel.
inline double backward_split_seconds(const BackwardSplitProblem& p, int64_t splits) {
  const int64_t sms = std::max<int64_t>(p.sms, 1);
  const int64_t blocks = std::max<int64_t>(p.per_split, 1) * splits;
  const int64_t waves = (blocks + sms - 1) / sms;
  const int64_t longest = (std::max<int64_t>(p.key_tiles, 1) + splits - 1) / splits;
  const double tile_flops = 2.0 * 5.0 * 128.0 * double(std::max<int64_t>(p.query_rows, 1)) * 64.0;
  double seconds = double(waves) * double(longest) * tile_flops / kBackwardFlopsPerSm;
  if (splits > 1)
    seconds += double(splits + 1) * double(p.dq_elements) * 4.0 / kBackwardBytesPerSecond;
  return seconds;
}

// The slices' f32 sums an automatic count may take, unless the first rule
// took more: the model does not charge for memory.
constexpr double kMaxAutoBackwardSliceBytes = double(int64_t(1) << 30);

// The automatic count: the first rule's, unless another count up to
// kMaxAutoBackwardSplits (and the key tiles, and the slices' bytes) is
// modelled more than 2% faster; then the fewest splits within 2% of the
// fastest (the model's time jumps from count to count: a count that wins
// by less than its error is not worth its slices).
inline int64_t auto_backward_splits(const BackwardSplitProblem& p) {
  const int64_t legacy = legacy_backward_splits(p);
  if (p.query_rows <= 0) return legacy;  // nothing to model with
  const double slice_bytes = double(p.dq_elements) * 4.0;
  int64_t cap = std::min<int64_t>(std::max<int64_t>(p.key_tiles, 1), kMaxAutoBackwardSplits);
  while (cap > legacy && double(cap) * slice_bytes > kMaxAutoBackwardSliceBytes) --cap;
  double best_seconds = backward_split_seconds(p, 1);
  for (int64_t s = 2; s <= cap; ++s)
    best_seconds = std::min(best_seconds, backward_split_seconds(p, s));
  const double good_enough = best_seconds * 1.02;
  if (backward_split_seconds(p, legacy) <= good_enough) return legacy;
  int64_t s = 1;
  while (backward_split_seconds(p, s) > good_enough) ++s;
  return s;
}

}  // namespace roformer::kernels::cuda
