#include "train/distributed/mpi_communicator.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "core/error.h"

namespace roformer::distributed {

namespace {

using Clock = std::chrono::steady_clock;

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
    return "MPI error " + std::to_string(code);
  return std::string(text, size_t(length));
}

}  // namespace

struct MpiCommunicator::State {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 1;
  double timeout_s = 0;
  bool initialised_here = false;
  std::vector<MPI_Request> started;  // start_*_sum() not yet waited for
  // A started reduce-scatter's counts (MPI reads them until it completes)
  // and where its sum goes once it has.
  struct Scatter {
    std::vector<int> counts;
    float* values;
    int64_t offset;  // of this rank's part
  };
  std::vector<Scatter> scatters;

  // After `started` completed: each reduce-scatter's sum, which MPI left at
  // the front of its buffer (MPI_IN_PLACE), to this rank's part.
  void place_scattered() {
    for (const Scatter& sc : scatters)
      if (sc.offset > 0)
        std::memmove(sc.values + sc.offset, sc.values,
                     size_t(sc.counts[size_t(rank)]) * sizeof(float));
    scatters.clear();
  }

  void check(int code, const char* what) const {
    if (code != MPI_SUCCESS)
      throw Error(detail::concat("MPI ", what, " failed on rank ", rank, " of ", size, ": ",
                                 mpi_error_string(code)));
  }

  // Waits for `requests` until the deadline; polls with short sleeps so a
  // waiting rank leaves the cores to the ones still computing.
  void wait(std::vector<MPI_Request>& requests, const char* what) {
    if (requests.empty()) return;
    const auto start = Clock::now();
    const auto deadline = start + std::chrono::duration<double>(timeout_s);
    int done = 0;
    for (int spins = 0;; ++spins) {
      check(MPI_Testall(int(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE), what);
      if (done) break;
      if (Clock::now() > deadline)
        throw Error(detail::concat(
            "rank ", rank, " of ", size, ": ", what, " did not complete within ", timeout_s,
            " s (distributed.timeout_s): another rank has died, failed or hangs; see the "
            "launcher's and the other ranks' messages for which one"));
      if (spins > 200) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    requests.clear();
  }
  void wait_one(MPI_Request request, const char* what) {
    std::vector<MPI_Request> one{request};
    wait(one, what);
  }
};

MpiCommunicator::MpiCommunicator(double timeout_s) : s_(std::make_unique<State>()) {
  s_->timeout_s = timeout_s;
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised) {
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
      throw Error("MPI_Init_thread failed (is this process started by mpirun or srun?)");
    s_->initialised_here = true;
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  s_->check(MPI_Comm_dup(MPI_COMM_WORLD, &s_->comm), "MPI_Comm_dup");
  s_->check(MPI_Comm_set_errhandler(s_->comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  s_->check(MPI_Comm_rank(s_->comm, &s_->rank), "MPI_Comm_rank");
  s_->check(MPI_Comm_size(s_->comm, &s_->size), "MPI_Comm_size");
}

MpiCommunicator::~MpiCommunicator() {
  // A rank unwinding from an error must not wait for peers in MPI_Finalize
  // (they may be blocked in a collective): the caller aborts instead.
  if (std::uncaught_exceptions() > 0) return;
  if (s_->comm != MPI_COMM_NULL) MPI_Comm_free(&s_->comm);
  if (s_->initialised_here) MPI_Finalize();
}

int MpiCommunicator::rank() const {
  return s_->rank;
}
int MpiCommunicator::world_size() const {
  return s_->size;
}

void MpiCommunicator::all_reduce_sum(std::span<double> values) {
  MPI_Request r;
  s_->check(MPI_Iallreduce(MPI_IN_PLACE, values.data(), int(values.size()), MPI_DOUBLE, MPI_SUM,
                           s_->comm, &r),
            "all-reduce (f64)");
  s_->wait_one(r, "an all-reduce of step statistics");
}

void MpiCommunicator::all_reduce_sum(std::span<int64_t> values) {
  MPI_Request r;
  s_->check(MPI_Iallreduce(MPI_IN_PLACE, values.data(), int(values.size()), MPI_INT64_T, MPI_SUM,
                           s_->comm, &r),
            "all-reduce (i64)");
  s_->wait_one(r, "an all-reduce of step counts");
}

void MpiCommunicator::all_reduce_sum(std::span<float> values) {
  start_all_reduce_sum(values);
  wait_started();
}

void MpiCommunicator::broadcast(std::span<std::byte> bytes, int root) {
  MPI_Request r;
  s_->check(MPI_Ibcast(bytes.data(), int(bytes.size()), MPI_BYTE, root, s_->comm, &r), "broadcast");
  s_->wait_one(r, "a broadcast");
}

void MpiCommunicator::barrier() {
  MPI_Request r;
  s_->check(MPI_Ibarrier(s_->comm, &r), "barrier");
  s_->wait_one(r, "a barrier");
}

void MpiCommunicator::all_gather(std::span<const float> mine, std::span<float> all) {
  RF_CHECK(all.size() == mine.size() * size_t(s_->size), "all_gather: ", all.size(), " slots for ",
           s_->size, " x ", mine.size(), " values");
  MPI_Request r;
  s_->check(MPI_Iallgather(mine.data(), int(mine.size()), MPI_FLOAT, all.data(), int(mine.size()),
                           MPI_FLOAT, s_->comm, &r),
            "all-gather");
  s_->wait_one(r, "an all-gather of optimizer state");
}

namespace {
// MPI's counts and displacements are ints: parts of unequal size as two
// arrays, or an error for a buffer beyond 2^31 - 1 floats.
struct Parts {
  std::vector<int> counts, displs;
};
Parts parts_of(std::span<const int64_t> counts, int size, const char* what) {
  RF_CHECK(counts.size() == size_t(size), what, ": ", counts.size(), " parts for ", size, " ranks");
  Parts p;
  int64_t offset = 0;
  for (int64_t c : counts) {
    if (c < 0 || offset + c > std::numeric_limits<int>::max())
      throw Error(
          detail::concat(what, ": ", offset + c, " floats exceed MPI's int counts (2^31 - 1)"));
    p.counts.push_back(int(c));
    p.displs.push_back(int(offset));
    offset += c;
  }
  return p;
}
}  // namespace

void MpiCommunicator::all_gather_in_place(std::span<float> values,
                                          std::span<const int64_t> counts) {
  const Parts p = parts_of(counts, s_->size, "all_gather_in_place");
  RF_CHECK(int64_t(values.size()) == int64_t(p.displs.back()) + p.counts.back(),
           "all_gather_in_place: ", values.size(), " values for parts summing to ",
           int64_t(p.displs.back()) + p.counts.back());
  MPI_Request r;
  s_->check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, values.data(), p.counts.data(),
                            p.displs.data(), MPI_FLOAT, s_->comm, &r),
            "all-gather (parameters)");
  s_->wait_one(r, "the all-gather of the updated parameters (ZeRO-1)");
}

void MpiCommunicator::gather(std::span<const float> mine, std::span<float> all,
                             std::span<const int64_t> counts, int root) {
  const Parts p = parts_of(counts, s_->size, "gather");
  RF_CHECK(int64_t(mine.size()) == p.counts[size_t(s_->rank)], "gather: ", mine.size(),
           " values for a part of ", p.counts[size_t(s_->rank)]);
  if (s_->rank == root)
    RF_CHECK(int64_t(all.size()) == int64_t(p.displs.back()) + p.counts.back(),
             "gather: ", all.size(), " slots for parts summing to ",
             int64_t(p.displs.back()) + p.counts.back());
  MPI_Request r;
  s_->check(MPI_Igatherv(mine.data(), int(mine.size()), MPI_FLOAT, all.data(), p.counts.data(),
                         p.displs.data(), MPI_FLOAT, root, s_->comm, &r),
            "gather (optimizer state)");
  s_->wait_one(r, "the gather of the optimizer state for a checkpoint (ZeRO-1)");
}

void MpiCommunicator::start_all_reduce_sum(std::span<float> values) {
  MPI_Request r;
  s_->check(MPI_Iallreduce(MPI_IN_PLACE, values.data(), int(values.size()), MPI_FLOAT, MPI_SUM,
                           s_->comm, &r),
            "all-reduce (gradients)");
  s_->started.push_back(r);
}

void MpiCommunicator::start_reduce_scatter_sum(std::span<float> values,
                                               std::span<const int64_t> counts) {
  const Parts p = parts_of(counts, s_->size, "reduce_scatter");
  const int64_t total = int64_t(p.displs.back()) + p.counts.back();
  RF_CHECK(int64_t(values.size()) == total, "reduce_scatter: ", values.size(),
           " values for parts summing to ", total);
  // OpenMPI's non-blocking reduce-scatter (libnbc) is slow on large buffers:
  // 21 MiB on 2 ranks took 17 ms whole, 5.5 ms as 8 pieces (an all-reduce:
  // 11 ms; docs/performance/distributed.md). So the buffer goes in pieces of at most
  // kPiece floats, each a reduce-scatter of its own, its parts the pieces of
  // the ranks' parts; every element is still summed once over the ranks.
  constexpr int64_t kPiece = int64_t(1) << 19;  // 2 MiB
  const int64_t mine_begin = p.displs[size_t(s_->rank)];
  for (int64_t begin = 0; begin < total; begin += kPiece) {
    const int64_t end = std::min(total, begin + kPiece);
    State::Scatter sc{{}, values.data() + begin, 0};
    for (int r = 0; r < s_->size; ++r) {
      const int64_t lo = std::max<int64_t>(begin, p.displs[size_t(r)]);
      const int64_t hi = std::min<int64_t>(end, int64_t(p.displs[size_t(r)]) + p.counts[size_t(r)]);
      sc.counts.push_back(int(std::max<int64_t>(0, hi - lo)));
    }
    // Where this rank's piece of its part goes, from the piece's front.
    sc.offset = std::clamp(mine_begin, begin, end) - begin;
    MPI_Request r;
    s_->check(MPI_Ireduce_scatter(MPI_IN_PLACE, sc.values, sc.counts.data(), MPI_FLOAT, MPI_SUM,
                                  s_->comm, &r),
              "reduce-scatter (gradients)");
    s_->started.push_back(r);
    s_->scatters.push_back(std::move(sc));
  }
}

void MpiCommunicator::progress() {
  if (s_->started.empty()) return;
  int done = 0;
  s_->check(MPI_Testall(int(s_->started.size()), s_->started.data(), &done, MPI_STATUSES_IGNORE),
            "progress of the gradient reduction");
  if (!done) return;
  s_->started.clear();
  s_->place_scattered();
}

void MpiCommunicator::wait_started() {
  s_->wait(s_->started, "the gradient all-reduce");
  s_->place_scattered();
}

void MpiCommunicator::abort(int exit_code) {
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);  // MPI_Abort returns only if MPI is broken
}

}  // namespace roformer::distributed
