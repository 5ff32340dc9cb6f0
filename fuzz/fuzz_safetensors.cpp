// The safetensors reader: header parsing and every tensor's conversion to f32.
#include "fuzz/fuzz_support.h"
#include "train/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = roformer::fuzz::input_file(data, size, ".safetensors");
  roformer::fuzz::expect_error_or_success([&] {
    const roformer::SafetensorsFile file(path);
    for (const auto& e : file.entries()) (void)file.read_f32(e.name);
  });
  return 0;
}
