// Errors: the library throws, only the CLI turns errors into exit codes.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace roformer {

// Any failure inside the library. The message names the op (or file, key,
// position) and the shapes/dtypes/values involved.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad input from a user: configs, shards, checkpoints, task files, command-line
// values. The CLI reports these without a stack of internals (exit code 2).
class InputError : public Error {
 public:
  using Error::Error;
};

// An allocator found no room (host or device memory): callers with a way
// that needs less memory catch this one (core/cuda/gemm.cpp's timing).
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <class... Args>
std::string concat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}
}  // namespace detail

}  // namespace roformer

// RF_CHECK(cond, parts...): throw roformer::Error with the streamed parts.
#define RF_CHECK(cond, ...)                                                        \
  do {                                                                             \
    if (!(cond)) throw ::roformer::Error(::roformer::detail::concat(__VA_ARGS__)); \
  } while (0)

// RF_INPUT_CHECK(cond, parts...): the same for bad user input.
#define RF_INPUT_CHECK(cond, ...)                                                       \
  do {                                                                                  \
    if (!(cond)) throw ::roformer::InputError(::roformer::detail::concat(__VA_ARGS__)); \
  } while (0)
