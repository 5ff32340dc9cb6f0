// The HDF5 corpus shard reader: open (every check) and the summary.
#include "data/shard.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = roformer::fuzz::input_file(data, size, ".h5");
  roformer::fuzz::expect_error_or_success([&] {
    const roformer::data::Shard shard = roformer::data::Shard::open(path);
    for (int64_t i = 0; i < shard.num_documents(); ++i) (void)shard.document(i);
  });
  roformer::fuzz::expect_error_or_success([&] { (void)roformer::data::describe_shard(path); });
  return 0;
}
