// Shared by the libFuzzer targets: the input as a file (the readers take
// paths), and the rule that a reader may reject any input with an Error but
// must never crash, hang, leak or throw anything else.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.h"

namespace roformer::fuzz {

// Writes the input to one temporary file per process and returns its path.
inline const std::string& input_file(const uint8_t* data, size_t size, const char* suffix) {
  static const std::string path =
      std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") + "/roformer-fuzz-" +
      std::to_string(::getpid()) + suffix;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return path;
}

// Runs `body`; roformer::Error (and its InputError) is the expected way to
// refuse bad input. Anything else escapes and libFuzzer reports it.
template <class F>
void expect_error_or_success(F&& body) {
  try {
    body();
  } catch (const roformer::Error&) {
  }
}

}  // namespace roformer::fuzz
