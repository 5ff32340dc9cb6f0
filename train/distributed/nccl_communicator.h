// Communicator for GPU ranks: gradients are summed by NCCL on the device,
// everything small (loss sums, flags, broadcasts of names and bytes) goes
// through the MPI communicator it is built on, which also carries NCCL's
// unique id from rank 0 to the others. One GPU per rank: cuda:<local rank>.
//
// NCCL reductions are waited for with a deadline: a peer that died or hangs
// makes the wait call ncclCommAbort (so no kernel spins forever) and throw
// after `timeout_s` seconds. The communicator is then unusable; the run stops.
//
// Chosen by make_communicator (communicators.h) for run.device cuda when
// every rank has a GPU of its own (NCCL refuses two ranks on one GPU).
#pragma once

#include <cstddef>
#include <memory>
#include <span>

#include "train/communicator.h"
#include "train/distributed/mpi_communicator.h"

namespace roformer::distributed {

class NcclCommunicator final : public Communicator {
 public:
  // Takes over `mpi` (it must outlive NCCL: NCCL's communicator is destroyed first).
  NcclCommunicator(std::unique_ptr<MpiCommunicator> mpi, int cuda_device, double timeout_s);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override;
  int world_size() const override;
  void all_reduce_sum(std::span<double> values) override;
  void all_reduce_sum(std::span<int64_t> values) override;
  // Host floats: staged through a device buffer, then summed by NCCL.
  void all_reduce_sum(std::span<float> values) override;
  void broadcast(std::span<std::byte> bytes, int root) override;
  void barrier() override;
  void all_gather(std::span<const float> mine, std::span<float> all) override;
  void all_gather_in_place(std::span<float> values, std::span<const int64_t> counts) override;
  void gather(std::span<const float> mine, std::span<float> all, std::span<const int64_t> counts,
              int root) override;

  // Gradient buckets: enqueued on NCCL's stream after `stream`'s work so
  // far; wait_started() waits for all of them with the deadline.
  bool sums_device_memory() const override { return true; }
  void start_all_reduce_sum_device(float* values, size_t count, void* stream) override;
  // ncclReduceScatter in place when the parts are equal; otherwise one
  // ncclReduce per part to its rank, in one NCCL group.
  void start_reduce_scatter_sum_device(float* values, std::span<const int64_t> counts,
                                       void* stream) override;
  void wait_started() override;

  // For a rank that failed: aborts NCCL (no kernel left waiting for peers),
  // then ends every rank through MPI_Abort. Does not return.
  [[noreturn]] void abort(int exit_code) override;

  // In place on device memory of this rank's GPU; returns when the sum is done.
  void all_reduce_sum_device(float* values, size_t count);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace roformer::distributed
