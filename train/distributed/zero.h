// ZeRO-1 over a Communicator: each rank keeps and updates one contiguous
// share of the AdamW moments (optim/adamw.h, MomentShard); after its update
// the ranks all-gather the parameters, so every rank holds the whole model
// again, and a checkpoint gathers the moments to the rank that writes it.
// The gradients are reduce-scattered at the same share bounds
// (gradient_reducer.h), or all-reduced whole with distributed.reduce_scatter
// false; the trainer takes the norm from the shares (optim/grad_norm.h).
#pragma once

#include <cstdint>
#include <vector>

#include "optim/adamw.h"
#include "train/communicator.h"

namespace roformer::distributed {

// This rank's share for `distributed.zero` (0: none, 1: sharded over the
// ranks). Throws InputError for ZeRO-1 with parameters on a GPU (the sharded
// AdamW pass is CPU-only).
optim::MomentShard zero_shard(int64_t zero, const Communicator& comm, Device device);

// The floats of each rank's share of the flat buffers, in rank order.
std::vector<int64_t> shard_sizes(const optim::AdamW& adamw, int world_size);

// After a sharded step: every rank ends with every share of the updated
// parameters. Nothing to do when the optimizer is not sharded.
void all_gather_parameters(const optim::AdamW& adamw, Communicator& comm);

// The whole moments, packed as AdamW::exp_avg() (a checkpoint's layout), on
// `root`; undefined tensors elsewhere. Every rank must call it.
struct Moments {
  Tensor exp_avg, exp_avg_sq;
};
Moments gather_moments(const optim::AdamW& adamw, Communicator& comm, int root);

// Bytes each rank sends per step for the gradients and, with ZeRO-1, the
// parameters' all-gather, by the ring model of the collectives over a flat
// buffer of `padded_numel` floats: an all-reduce sends 2 (N-1)/N of it, a
// reduce-scatter or an all-gather (N-1)/N. A model (MPI picks its own
// algorithms and reports no byte counts), the same for every rank.
int64_t bytes_sent_per_step(int64_t padded_numel, int world_size, bool zero, bool reduce_scatter);

// What the training state takes on each rank, in bytes: the flat parameter
// and gradient buffers (whole on every rank) and the AdamW moments (this
// rank's share; every rank's, from the same split, in rank order).
struct MemoryPerRank {
  int64_t param_bytes = 0, grad_bytes = 0, optimizer_state_bytes = 0;
  std::vector<int64_t> optimizer_state_bytes_per_rank;
};
MemoryPerRank memory_per_rank(const optim::AdamW& adamw, const Communicator& comm);

}  // namespace roformer::distributed
