// Where a forward pass draws its dropout numbers from. Dropout depends only on
// (seed, step, the sequence's index in the global batch, the site, the
// position), so k micro-batches or N ranks give the same run as one batch
// (up to float summation order) and nothing per rank needs checkpointing.
#pragma once

#include <cstdint>

namespace roformer {

// One dropout site's identity, as the kernels see it.
struct DropoutKey {
  uint64_t seed = 0;
  uint64_t step = 0;
  int64_t first_sequence = 0;  // global-batch index of the tensor's row 0
  uint32_t site = 0;
};

struct DropoutContext {
  uint64_t seed = 0;
  uint64_t step = 0;           // the optimizer step this forward belongs to
  int64_t first_sequence = 0;  // global-batch index of this micro-batch's row 0
  uint32_t next_site = 0;      // sites are numbered in forward call order

  // The key for the next dropout site of this forward pass.
  DropoutKey next_site_key() { return {seed, step, first_sequence, next_site++}; }
};

}  // namespace roformer
