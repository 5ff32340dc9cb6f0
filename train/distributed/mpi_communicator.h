// Communicator over MPI (OpenMPI from Debian), one process per rank. The
// object owns MPI: its constructor initialises it (MPI_THREAD_FUNNELED: only
// the thread that made it calls MPI) and its destructor finalises it. Errors
// come back as return codes (MPI_ERRORS_RETURN on a private duplicate of
// MPI_COMM_WORLD) and are thrown as Error naming the operation.
//
// Every collective is started non-blocking and waited for with a deadline:
// a peer that died or hangs makes the wait throw after `timeout_s` seconds
// instead of blocking forever (MPI's default on a dead peer).
#pragma once

#include <memory>
#include <string>

#include "train/communicator.h"

namespace roformer::distributed {

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(double timeout_s);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override;
  int world_size() const override;
  void all_reduce_sum(std::span<double> values) override;
  void all_reduce_sum(std::span<int64_t> values) override;
  void all_reduce_sum(std::span<float> values) override;
  void broadcast(std::span<std::byte> bytes, int root) override;
  void barrier() override;
  void all_gather(std::span<const float> mine, std::span<float> all) override;
  void all_gather_in_place(std::span<float> values, std::span<const int64_t> counts) override;
  void gather(std::span<const float> mine, std::span<float> all, std::span<const int64_t> counts,
              int root) override;
  void start_all_reduce_sum(std::span<float> values) override;
  // MPI_Ireduce_scatter in place, in pieces of 2 MiB (OpenMPI's is slow on
  // large buffers); MPI leaves this rank's sum of a piece at the piece's
  // front, and wait_started() moves it to its place in the part.
  void start_reduce_scatter_sum(std::span<float> values, std::span<const int64_t> counts) override;
  void progress() override;
  void wait_started() override;

  // Ends every rank's process (MPI_Abort) with `exit_code`: for a rank that
  // failed while the others may be blocked in a collective. Does not return.
  [[noreturn]] void abort(int exit_code) override;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace roformer::distributed
