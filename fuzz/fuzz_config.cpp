// The YAML config reader: any text is a config or an InputError naming where.
#include <string_view>

#include "fuzz/fuzz_support.h"
#include "train/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  roformer::fuzz::expect_error_or_success([&] {
    const roformer::Config c = roformer::parse_config_string(text, "fuzz.yaml");
    // What is accepted must survive a round trip through its own YAML.
    const roformer::Config again = roformer::parse_config_string(roformer::to_yaml(c), "again");
    if (!(again == c)) std::abort();
    (void)c.total_steps();
  });
  return 0;
}
