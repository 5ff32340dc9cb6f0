// Checks before opening a file the user named, so a directory or a special
// file is reported as such rather than as "empty" or "corrupt".
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "core/error.h"

namespace roformer {

// Throws InputError naming `what` (e.g. "config file") and the path when it is
// a directory: reading one yields nothing, which would be reported as "empty".
// A missing path is left to the caller's own message.
inline void reject_directory(const std::filesystem::path& path, std::string_view what) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw InputError(
        detail::concat(what, " '", path.string(), "' is a directory, expected a file"));
}

}  // namespace roformer
