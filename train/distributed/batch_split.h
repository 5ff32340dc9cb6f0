// How a stage's global batch is cut: over ranks first, then each rank's share
// into micro-batches of at most the configured micro_batch_size. Rank r's
// micro-batch i holds global rows [(i * world + r) * m, ... + m), the order
// the loader hands them out in (data/loader.h), so every rank reads its own
// slice of one global order and dropout keys on the same row numbers at any
// world size.
#pragma once

#include <cstdint>
#include <string>

namespace roformer::distributed {

struct BatchSplit {
  int64_t per_rank = 0;          // sequences per rank per step
  int64_t micro_batch_size = 0;  // sequences per forward/backward
  int64_t micro_batches = 0;     // forward/backward passes per rank per step
  // Global row of micro-batch `i` on `rank`'s first sequence.
  int64_t first_row(int rank, int world_size, int64_t i) const {
    return (i * world_size + rank) * micro_batch_size;
  }
};

// Throws InputError naming `where` ("stages[1]") and the numbers when
// `batch_size` does not split evenly over `world_size` ranks, or a rank's
// share does not split into micro-batches of `micro_batch_size` (a
// micro_batch_size above the share is lowered to it).
BatchSplit split_batch(int64_t batch_size, int64_t micro_batch_size, int world_size,
                       const std::string& where);

}  // namespace roformer::distributed
