// How rotary position embedding pairs the dimensions of a head.
#pragma once

namespace roformer {

// interleaved rotates pairs (x[2i], x[2i+1]) as the paper (eq. 34) and the
// public RoFormer checkpoints do; half pairs (x[i], x[i + d/2]) as GPT-NeoX
// and LLaMA-family weights do. The k-prefixed names are the config code's
// spelling of the same values.
enum class RopeLayout { interleaved, half, kInterleaved = interleaved, kHalf = half };

}  // namespace roformer
