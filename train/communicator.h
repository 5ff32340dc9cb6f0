// The collective operations the Trainer needs to agree across ranks: every
// decision that must be the same on every rank (the loss normaliser, whether
// a step is skipped, whether to stop) is a reduction through this interface,
// so the loop reads the same for one process and for many. The single-process
// implementation is the identity; MPI and NCCL implementations plug in here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

namespace roformer {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // In place: every rank ends with the element-wise sum over all ranks.
  virtual void all_reduce_sum(std::span<double> values) = 0;
  virtual void all_reduce_sum(std::span<int64_t> values) = 0;
  // In place: every rank ends with `root`'s bytes.
  virtual void broadcast(std::span<std::byte> bytes, int root) = 0;
  virtual void barrier() = 0;

  // Conveniences built on the reductions above.
  int64_t sum(int64_t value);
  double sum(double value);
  bool any(bool flag);  // true on every rank when it is true on one
};

// One process: rank 0 of 1; reductions and broadcasts leave values as they are.
class SingleProcessCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  void all_reduce_sum(std::span<double>) override {}
  void all_reduce_sum(std::span<int64_t>) override {}
  void broadcast(std::span<std::byte>, int) override {}
  void barrier() override {}
};

}  // namespace roformer
