#include "train/communicator.h"

#include <algorithm>

#include "core/error.h"

namespace roformer {

int64_t Communicator::sum(int64_t value) {
  all_reduce_sum(std::span<int64_t>(&value, 1));
  return value;
}

double Communicator::sum(double value) {
  all_reduce_sum(std::span<double>(&value, 1));
  return value;
}

bool Communicator::any(bool flag) {
  return sum(int64_t(flag ? 1 : 0)) > 0;
}

std::string Communicator::broadcast(std::string text, int root) {
  int64_t size = rank() == root ? int64_t(text.size()) : 0;
  broadcast(std::as_writable_bytes(std::span<int64_t>(&size, 1)), root);
  text.resize(size_t(size));
  broadcast(std::as_writable_bytes(std::span<char>(text.data(), text.size())), root);
  return text;
}

void Communicator::start_all_reduce_sum_device(float*, size_t, void*) {
  throw Error("this communicator cannot sum device memory (NCCL is needed)");
}

void Communicator::start_reduce_scatter_sum_device(float*, std::span<const int64_t>, void*) {
  throw Error("this communicator cannot sum device memory (NCCL is needed)");
}

int64_t reduce_scatter_total(std::span<const int64_t> counts, int world_size, const char* what) {
  RF_CHECK(counts.size() == size_t(world_size), what, ": ", counts.size(), " parts for ",
           world_size, " ranks");
  int64_t total = 0;
  for (int64_t c : counts) {
    RF_CHECK(c >= 0, what, ": a part of ", c, " floats");
    total += c;
  }
  return total;
}

void Communicator::start_reduce_scatter_sum(std::span<float> values,
                                            std::span<const int64_t> counts) {
  RF_CHECK(reduce_scatter_total(counts, world_size(), "reduce_scatter") == int64_t(values.size()),
           "reduce_scatter: ", values.size(), " values for parts of another total");
  start_all_reduce_sum(values);
}

void SingleProcessCommunicator::all_gather(std::span<const float> mine, std::span<float> all) {
  RF_CHECK(all.size() == mine.size(), "all_gather: ", all.size(), " slots for ", mine.size(),
           " values");
  std::copy(mine.begin(), mine.end(), all.begin());
}

void SingleProcessCommunicator::all_gather_in_place(std::span<float> values,
                                                    std::span<const int64_t> counts) {
  RF_CHECK(counts.size() == 1 && counts[0] == int64_t(values.size()),
           "all_gather_in_place: ", values.size(), " values for ", counts.size(), " part(s)");
}

void SingleProcessCommunicator::gather(std::span<const float> mine, std::span<float> all,
                                       std::span<const int64_t> counts, int root) {
  RF_CHECK(root == 0 && counts.size() == 1 && counts[0] == int64_t(mine.size()) &&
               all.size() == mine.size(),
           "gather: ", all.size(), " slots for ", mine.size(), " values");
  std::copy(mine.begin(), mine.end(), all.begin());
}

}  // namespace roformer
