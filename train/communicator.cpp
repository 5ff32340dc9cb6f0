#include "train/communicator.h"

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

}  // namespace roformer
