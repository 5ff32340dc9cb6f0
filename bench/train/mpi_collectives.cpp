// The gradient collectives of train/distributed/ on their own: MPI's
// non-blocking all-reduce and reduce-scatter (in place, as MpiCommunicator
// calls them) on one float buffer, whole and split into pieces, next to the
// blocking calls. Prints rank 0's median time of each over REPS calls, and
// checks that an in-place reduce-scatter leaves each rank's sum at the
// buffer's front, equal bit for bit to the all-reduce's.
// Usage: mpirun -np 2 build/bench/train/mpi_collectives [MIB] [REPS]
// Figures: docs/performance/distributed.md, "ZeRO-1's gradients: reduce-scatter vs all-reduce".
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace {

// Parts of `n` floats over `size` ranks, the remainder on the last.
std::vector<int> parts(size_t n, int size) {
  std::vector<int> counts(size_t(size), int(n / size_t(size)));
  counts.back() += int(n % size_t(size));
  return counts;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const double mib = argc > 1 ? std::atof(argv[1]) : 21.0;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 11;
  const size_t n = size_t(mib * 1048576 / sizeof(float));
  std::vector<float> buf(n);
  for (size_t i = 0; i < n; ++i) buf[i] = float(rank + 1) * 0.001f * float(i % 1000);

  // In place: a reduce-scatter's sum at the front equals the all-reduce's part.
  const std::vector<int> counts = parts(n, size);
  int offset = 0;
  for (int r = 0; r < rank; ++r) offset += counts[size_t(r)];
  std::vector<float> whole = buf, scattered = buf;
  MPI_Allreduce(MPI_IN_PLACE, whole.data(), int(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Reduce_scatter(MPI_IN_PLACE, scattered.data(), counts.data(), MPI_FLOAT, MPI_SUM,
                     MPI_COMM_WORLD);
  int same = std::memcmp(whole.data() + offset, scattered.data(),
                         size_t(counts[size_t(rank)]) * sizeof(float)) == 0;
  MPI_Allreduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (rank == 0)
    std::printf("%d ranks, %.2f MiB, %d calls each; in-place reduce-scatter == all-reduce: %s\n",
                size, mib, reps, same ? "yes" : "NO");

  auto time = [&](const std::string& name, const std::function<void()>& call) {
    std::vector<double> seconds;
    for (int i = 0; i < reps; ++i) {
      MPI_Barrier(MPI_COMM_WORLD);
      const auto t0 = std::chrono::steady_clock::now();
      call();
      seconds.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(seconds.begin(), seconds.end());
    if (rank == 0)
      std::printf("%-30s median %7.2f ms\n", name.c_str(), 1e3 * seconds[seconds.size() / 2]);
  };
  // `pieces` non-blocking calls over consecutive pieces, then one wait.
  auto pieced = [&](int pieces, bool scatter) {
    std::vector<MPI_Request> requests(static_cast<size_t>(pieces));
    std::vector<std::vector<int>> piece_counts(static_cast<size_t>(pieces));
    const size_t per = n / size_t(pieces);
    for (int p = 0; p < pieces; ++p) {
      const size_t m = p + 1 == pieces ? n - per * size_t(p) : per;
      float* at = buf.data() + per * size_t(p);
      if (scatter) {
        piece_counts[size_t(p)] = parts(m, size);
        MPI_Ireduce_scatter(MPI_IN_PLACE, at, piece_counts[size_t(p)].data(), MPI_FLOAT, MPI_SUM,
                            MPI_COMM_WORLD, &requests[size_t(p)]);
      } else {
        MPI_Iallreduce(MPI_IN_PLACE, at, int(m), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD,
                       &requests[size_t(p)]);
      }
    }
    MPI_Waitall(pieces, requests.data(), MPI_STATUSES_IGNORE);
  };
  time("Iallreduce", [&] { pieced(1, false); });
  time("Iallreduce in 8 pieces", [&] { pieced(8, false); });
  time("Allreduce (blocking)", [&] {
    MPI_Allreduce(MPI_IN_PLACE, buf.data(), int(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  });
  time("Ireduce_scatter", [&] { pieced(1, true); });
  time("Ireduce_scatter in 8 pieces", [&] { pieced(8, true); });
  time("Reduce_scatter (blocking)", [&] {
    MPI_Reduce_scatter(MPI_IN_PLACE, buf.data(), counts.data(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  });
  MPI_Finalize();
  return 0;
}
