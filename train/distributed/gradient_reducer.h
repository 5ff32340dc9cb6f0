// Data-parallel gradient reduction over the flat gradient buffer
// (core/flat_parameters.h). Parameters are grouped into buckets of about
// `bucket_bytes` in reverse parameter order (the order backward finishes
// them: the output layers first). During a step's last backward on this
// rank, each parameter's ready hook marks it done; a bucket whose parameters
// are all done is all-reduced (non-blocking) while backward goes on.
//
// Deterministic: buckets are always started in the same fixed order (bucket
// k only after bucket k-1, whatever order the hooks fire in), each is one
// sum over the same ranks, and the loss weights already divide by the global
// unit count, so the summed gradient is the global batch's mean gradient.
//
// ZeRO-1 (zero.h) passes the ranks' share bounds: each bucket is then
// reduce-scattered instead (half the traffic), so after finish() a rank holds
// the summed gradient of its own share only; the rest of its buffer keeps its
// own unsummed gradient, which nothing reads (the norm is the shares' partials,
// optim/grad_norm.h, and the update touches the share alone). For two ranks
// each element is the same one addition either way, so the sums are the
// all-reduce's bit for bit; with more, MPI may associate the sum differently.
//
// Where the gradients live decides the path: CPU buffers are summed in place
// by the communicator (MPI); GPU buffers in place on the device when the
// communicator sums device memory (NCCL), otherwise each bucket is copied to
// the host, summed there and copied back in finish().
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/flat_parameters.h"
#include "train/communicator.h"

namespace roformer::distributed {

class GradientReducer {
 public:
  // `shard_bounds`: world_size + 1 boundaries of the ranks' shares of the
  // flat buffer (AdamW::shard_bounds) to reduce-scatter; empty: all-reduce.
  GradientReducer(std::shared_ptr<FlatParameters> flat, Communicator& comm, int64_t bucket_bytes,
                  std::vector<int64_t> shard_bounds = {});
  ~GradientReducer();  // removes the hooks
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // The next backward is this rank's last of the step: reduce buckets as they fill.
  void arm();
  // Starts the buckets not started yet and waits for all. Afterwards the
  // gradient buffer holds the sum over ranks on every rank (with shard
  // bounds: in this rank's share).
  void finish();
  // Which parameters got a gradient on this rank (1 or 0 each), appended to
  // `flags`: the caller sums them over the ranks in a reduction the step does
  // anyway (the trainer's step statistics) and hands the sums to
  // adopt_gradients(), which gives every rank the same set of parameters with
  // a gradient (one that got none here but did elsewhere gets the reduced
  // one), so AdamW updates and decays the same parameters everywhere.
  void append_gradient_flags(std::vector<int64_t>& flags) const;
  void adopt_gradients(std::span<const int64_t> summed_flags);

  size_t num_buckets() const { return buckets_.size(); }
  bool scatters() const { return !shard_bounds_.empty(); }
  // Seconds finish() spent blocked on communication (not hidden by backward), summed.
  double blocked_seconds() const { return blocked_s_; }

 private:
  struct Bucket {
    int64_t begin = 0, end = 0;  // range of the flat gradient buffer
    int64_t params = 0;          // parameters in it
    int64_t pending = 0;         // of those, not ready yet in this backward
  };
  void on_ready(size_t index);
  void start_ready_buckets();
  void start(const Bucket& b);
  // The bucket's parts per rank for a reduce-scatter.
  std::vector<int64_t> parts(const Bucket& b) const;

  // A bucket of GPU gradients summed through host memory (no NCCL).
  struct Staged {
    int64_t begin;
    Tensor host;
  };

  std::shared_ptr<FlatParameters> flat_;
  Communicator& comm_;
  std::vector<Bucket> buckets_;  // in start order
  std::vector<int64_t> shard_bounds_;
  std::vector<size_t> bucket_of_;
  std::vector<char> ready_;
  size_t next_ = 0;  // the next bucket to start
  bool armed_ = false;
  std::vector<Staged> staged_;  // started, copied back in finish()
  double blocked_s_ = 0;
};

}  // namespace roformer::distributed
