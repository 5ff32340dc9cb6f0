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
