// The collective operations the Trainer needs to agree across ranks: every
// decision that must be the same on every rank (the loss normaliser, whether
// a step is skipped, whether to stop) is a reduction through this interface,
// so the loop reads the same for one process and for many. The single-process
// implementation is the identity; the MPI one (train/distributed/) plugs in
// here, and the gradient buckets (distributed/gradient_reducer.h) run on it.
//
// Every rank must issue the same collectives in the same order. A collective
// that cannot complete (a peer died or hangs) throws Error after the
// communicator's timeout instead of waiting forever.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace roformer {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // In place: every rank ends with the element-wise sum over all ranks.
  virtual void all_reduce_sum(std::span<double> values) = 0;
  virtual void all_reduce_sum(std::span<int64_t> values) = 0;
  virtual void all_reduce_sum(std::span<float> values) = 0;
  // In place: every rank ends with `root`'s bytes.
  virtual void broadcast(std::span<std::byte> bytes, int root) = 0;
  virtual void barrier() = 0;
  // `all` ([world_size * mine.size()]) ends with every rank's `mine`, in rank order.
  virtual void all_gather(std::span<const float> mine, std::span<float> all) = 0;
  // Parts of unequal size (ZeRO-1's shards): rank r's part is counts[r]
  // floats, the parts lie back to back in rank order in a buffer of
  // sum(counts). In place: `values` holds this rank's part at its offset and
  // every rank ends with every part.
  virtual void all_gather_in_place(std::span<float> values, std::span<const int64_t> counts) = 0;
  // `mine` ([counts[rank]]) lands at its offset of `root`'s `all`
  // ([sum(counts)]); `all` is not touched on the other ranks.
  virtual void gather(std::span<const float> mine, std::span<float> all,
                      std::span<const int64_t> counts, int root) = 0;

  // Overlapped reductions: start_all_reduce_sum() begins an in-place sum and
  // returns at once (the memory must stay untouched until wait_started());
  // progress() lets started ones advance. Implementations without overlap
  // reduce at once.
  virtual void start_all_reduce_sum(std::span<float> values) { all_reduce_sum(values); }
  virtual void progress() {}
  virtual void wait_started() {}

  // Reduce-scatter, the inverse of all_gather_in_place (ZeRO-1's gradients):
  // `values` holds this rank's whole vector, parts of counts[r] floats back
  // to back in rank order (sum(counts) in all). Started like
  // start_all_reduce_sum, in place and waited for by wait_started():
  // afterwards this rank's part holds the element-wise sum over the ranks of
  // that part; the rest of `values` is left undefined. Half the traffic of an
  // all-reduce. The default sums everything (an all-reduce does the job).
  virtual void start_reduce_scatter_sum(std::span<float> values, std::span<const int64_t> counts);

  // Gradients on a GPU. True when start_all_reduce_sum_device sums device
  // memory in place (NCCL); otherwise the gradient buckets are staged
  // through host memory and summed with start_all_reduce_sum.
  virtual bool sums_device_memory() const { return false; }
  // Starts an in-place sum of `count` floats of this rank's GPU memory, after
  // the work queued so far on `stream` (a cudaStream_t; null: the default
  // stream); wait_started() waits for it. Only when sums_device_memory().
  virtual void start_all_reduce_sum_device(float* values, size_t count, void* stream);
  // The device form of start_reduce_scatter_sum, on `stream` as above.
  virtual void start_reduce_scatter_sum_device(float* values, std::span<const int64_t> counts,
                                               void* stream);

  // For a rank that failed: ends every rank's process with `exit_code` (the
  // others may be blocked in a collective and must not wait for its timeout).
  // One process has no peers to stop: it returns.
  virtual void abort(int exit_code) { (void)exit_code; }

  // Conveniences built on the operations above.
  int64_t sum(int64_t value);
  double sum(double value);
  bool any(bool flag);  // true on every rank when it is true on one
  // Every rank ends with `root`'s string.
  std::string broadcast(std::string text, int root);
};

// sum(counts) for a reduce-scatter's parts, checked: one part per rank, none
// negative (Error naming `what` otherwise).
int64_t reduce_scatter_total(std::span<const int64_t> counts, int world_size, const char* what);

// One process: rank 0 of 1; reductions and broadcasts leave values as they are.
class SingleProcessCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  void all_reduce_sum(std::span<double>) override {}
  void all_reduce_sum(std::span<int64_t>) override {}
  void all_reduce_sum(std::span<float>) override {}
  void broadcast(std::span<std::byte>, int) override {}
  void barrier() override {}
  void all_gather(std::span<const float> mine, std::span<float> all) override;
  void all_gather_in_place(std::span<float> values, std::span<const int64_t> counts) override;
  void gather(std::span<const float> mine, std::span<float> all, std::span<const int64_t> counts,
              int root) override;
};

}  // namespace roformer
