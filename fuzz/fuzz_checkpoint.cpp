// The HDF5 checkpoint reader, with the optimizer state, and its summary.
#include "fuzz/fuzz_support.h"
#include "train/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = roformer::fuzz::input_file(data, size, ".h5");
  roformer::fuzz::expect_error_or_success([&] { (void)roformer::load_checkpoint(path, true); });
  roformer::fuzz::expect_error_or_success([&] { (void)roformer::describe_checkpoint(path); });
  return 0;
}
