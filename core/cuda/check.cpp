#include "core/cuda/check.h"

#include <cstring>

#include "core/error.h"

namespace roformer::cuda {

void throw_call_error(const char* library, const char* call, const char* message, const char* file,
                      int line) {
  // Only the file name: the build directory's absolute path says nothing.
  const char* slash = std::strrchr(file, '/');
  throw Error(detail::concat(library, " call ", call, " failed: ", message, " (",
                             slash ? slash + 1 : file, ":", line, ")"));
}

}  // namespace roformer::cuda
