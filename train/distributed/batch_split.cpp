#include "train/distributed/batch_split.h"

#include <algorithm>

#include "core/error.h"

namespace roformer::distributed {

BatchSplit split_batch(int64_t batch_size, int64_t micro_batch_size, int world_size,
                       const std::string& where) {
  if (world_size < 1 || batch_size < 1 || micro_batch_size < 1)
    throw InputError(detail::concat(where, ": batch_size ", batch_size, ", micro_batch_size ",
                                    micro_batch_size, " and world size ", world_size,
                                    " must be positive"));
  if (batch_size % world_size != 0)
    throw InputError(detail::concat(where, ": batch_size ", batch_size, " does not split over ",
                                    world_size,
                                    " ranks (the global batch must be a multiple of "
                                    "the world size)"));
  BatchSplit s;
  s.per_rank = batch_size / world_size;
  s.micro_batch_size = std::min(micro_batch_size, s.per_rank);
  if (s.per_rank % s.micro_batch_size != 0)
    throw InputError(detail::concat(
        where, ": batch_size ", batch_size, " over ", world_size, " rank(s) is ", s.per_rank,
        " sequences per rank, which micro_batch_size ", s.micro_batch_size, " does not divide"));
  s.micro_batches = s.per_rank / s.micro_batch_size;
  return s;
}

}  // namespace roformer::distributed
