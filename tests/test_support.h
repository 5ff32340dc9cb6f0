// Helpers shared by the test folders.
#pragma once

#include <exception>
#include <functional>
#include <string>

#include "core/error.h"

namespace roformer::testing {

// The message of the E that fn throws, "no error" when it throws nothing, and
// "NOT AN E: ..." for any other exception, so a test can assert on the text.
template <class E = Error>
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("NOT AN expected error type: ") + e.what();
  }
  return "no error";
}

}  // namespace roformer::testing
