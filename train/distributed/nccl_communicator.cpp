#include "train/distributed/nccl_communicator.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "core/cuda/check_nccl.h"
#include "core/cuda/raii.h"
#include "core/error.h"

namespace roformer::distributed {

struct NcclCommunicator::State {
  std::unique_ptr<MpiCommunicator> mpi;
  int device = 0;
  double timeout_s = 120;
  ncclComm_t comm = nullptr;
  bool failed = false;  // aborted: ncclCommDestroy must not be called
  cuda::CudaStream stream;
  cuda::CudaEvent ready;  // the compute stream's gradients are complete up to here
  bool started = false;   // gradient sums enqueued since the last wait_started()
  cuda::UniqueHandle<void*, cuda::ReleaseDeviceMemory> staging;
  size_t staging_floats = 0;

  // Waits for the stream with a deadline, watching NCCL's asynchronous errors.
  void wait(const char* what) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    for (;;) {
      const cudaError_t done = cudaStreamQuery(stream.get());
      if (done == cudaSuccess) return;
      if (done != cudaErrorNotReady) {
        abort_comm();
        RF_CUDA_CHECK(done);
      }
      ncclResult_t async = ncclSuccess;
      RF_CUDA_CHECK(ncclCommGetAsyncError(comm, &async));
      if (async != ncclSuccess) {
        abort_comm();
        throw Error(detail::concat("NCCL ", what, " on rank ", mpi->rank(), " of ",
                                   mpi->world_size(), " failed: ", ncclGetErrorString(async),
                                   " (a peer rank may have died)"));
      }
      if (std::chrono::steady_clock::now() > deadline) {
        abort_comm();
        throw Error(detail::concat("NCCL ", what, " on rank ", mpi->rank(), " of ",
                                   mpi->world_size(), " did not complete within ", timeout_s,
                                   " s (distributed.timeout_s): a peer rank died or hangs"));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  void abort_comm() {
    if (comm && !failed) ncclCommAbort(comm);
    failed = true;
  }

  void check_usable() const {
    if (failed) throw Error("NCCL communicator used after a failed collective");
  }
};

NcclCommunicator::NcclCommunicator(std::unique_ptr<MpiCommunicator> mpi, int cuda_device,
                                   double timeout_s)
    : s_(std::make_unique<State>()) {
  s_->mpi = std::move(mpi);
  s_->device = cuda_device;
  s_->timeout_s = timeout_s;
  RF_CUDA_CHECK(cudaSetDevice(cuda_device));
  // Rank 0 makes the id; MPI carries it to the others.
  ncclUniqueId id{};
  if (s_->mpi->rank() == 0) RF_CUDA_CHECK(ncclGetUniqueId(&id));
  s_->mpi->broadcast(std::as_writable_bytes(std::span<ncclUniqueId>(&id, 1)), 0);
  RF_CUDA_CHECK(ncclCommInitRank(&s_->comm, s_->mpi->world_size(), id, s_->mpi->rank()));
  s_->stream = cuda::CudaStream::create_non_blocking();
  s_->ready = cuda::CudaEvent::create();
}

NcclCommunicator::~NcclCommunicator() {
  // An aborted communicator is already released.
  if (s_ && s_->comm && !s_->failed) ncclCommDestroy(s_->comm);
}

int NcclCommunicator::rank() const {
  return s_->mpi->rank();
}
int NcclCommunicator::world_size() const {
  return s_->mpi->world_size();
}
void NcclCommunicator::all_reduce_sum(std::span<double> values) {
  s_->mpi->all_reduce_sum(values);
}
void NcclCommunicator::all_reduce_sum(std::span<int64_t> values) {
  s_->mpi->all_reduce_sum(values);
}
void NcclCommunicator::broadcast(std::span<std::byte> bytes, int root) {
  s_->mpi->broadcast(bytes, root);
}
void NcclCommunicator::barrier() {
  s_->mpi->barrier();
}
void NcclCommunicator::all_gather(std::span<const float> mine, std::span<float> all) {
  s_->mpi->all_gather(mine, all);
}

void NcclCommunicator::all_gather_in_place(std::span<float> values,
                                           std::span<const int64_t> counts) {
  s_->mpi->all_gather_in_place(values, counts);
}

void NcclCommunicator::gather(std::span<const float> mine, std::span<float> all,
                              std::span<const int64_t> counts, int root) {
  s_->mpi->gather(mine, all, counts, root);
}

void NcclCommunicator::all_reduce_sum(std::span<float> values) {
  if (values.empty()) return;
  cuda::DeviceGuard on(s_->device);
  if (s_->staging_floats < values.size()) {
    s_->staging.reset();
    void* p = nullptr;
    RF_CUDA_CHECK(cudaMalloc(&p, values.size_bytes()));
    s_->staging = cuda::UniqueHandle<void*, cuda::ReleaseDeviceMemory>(p);
    s_->staging_floats = values.size();
  }
  float* device = static_cast<float*>(s_->staging.get());
  RF_CUDA_CHECK(cudaMemcpyAsync(device, values.data(), values.size_bytes(), cudaMemcpyHostToDevice,
                                s_->stream.get()));
  all_reduce_sum_device(device, values.size());
  RF_CUDA_CHECK(cudaMemcpyAsync(values.data(), device, values.size_bytes(), cudaMemcpyDeviceToHost,
                                s_->stream.get()));
  s_->wait("copy back");
}

void NcclCommunicator::start_all_reduce_sum_device(float* values, size_t count, void* stream) {
  s_->check_usable();
  cuda::DeviceGuard on(s_->device);
  // NCCL's stream waits for the backward work that produced the bucket.
  s_->ready.record(static_cast<cudaStream_t>(stream));
  s_->ready.block(s_->stream.get());
  RF_CUDA_CHECK(
      ncclAllReduce(values, values, count, ncclFloat32, ncclSum, s_->comm, s_->stream.get()));
  s_->started = true;
}

void NcclCommunicator::start_reduce_scatter_sum_device(float* values,
                                                       std::span<const int64_t> counts,
                                                       void* stream) {
  s_->check_usable();
  reduce_scatter_total(counts, world_size(), "reduce_scatter (NCCL)");
  cuda::DeviceGuard on(s_->device);
  s_->ready.record(static_cast<cudaStream_t>(stream));
  s_->ready.block(s_->stream.get());
  const int rank = s_->mpi->rank();
  if (std::all_of(counts.begin(), counts.end(), [&](int64_t c) { return c == counts[0]; })) {
    // In place: this rank's part of the input is its output.
    const size_t part = size_t(counts[0]);
    RF_CUDA_CHECK(ncclReduceScatter(values, values + size_t(rank) * part, part, ncclFloat32,
                                    ncclSum, s_->comm, s_->stream.get()));
  } else {
    // ncclReduceScatter wants equal parts: part r reduced to rank r instead,
    // each in place (a root's input is its output).
    RF_CUDA_CHECK(ncclGroupStart());
    size_t offset = 0;
    for (size_t r = 0; r < counts.size(); ++r) {
      float* part = values + offset;
      RF_CUDA_CHECK(ncclReduce(part, part, size_t(counts[r]), ncclFloat32, ncclSum, int(r),
                               s_->comm, s_->stream.get()));
      offset += size_t(counts[r]);
    }
    RF_CUDA_CHECK(ncclGroupEnd());
  }
  s_->started = true;
}

void NcclCommunicator::wait_started() {
  if (!s_->started) return;
  s_->started = false;
  cuda::DeviceGuard on(s_->device);
  s_->wait("gradient all-reduce");
}

void NcclCommunicator::abort(int exit_code) {
  s_->abort_comm();
  s_->mpi->abort(exit_code);
}

void NcclCommunicator::all_reduce_sum_device(float* values, size_t count) {
  s_->check_usable();
  cuda::DeviceGuard on(s_->device);
  // NCCL's ring/tree order is fixed for a given world size and topology, so
  // the same inputs give the same sums whatever the timing.
  RF_CUDA_CHECK(
      ncclAllReduce(values, values, count, ncclFloat32, ncclSum, s_->comm, s_->stream.get()));
  s_->wait("all-reduce");
}

}  // namespace roformer::distributed
