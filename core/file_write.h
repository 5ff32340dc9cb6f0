// Files written whole or not at all, so a crash, a full disk or a killed
// process never leaves a half-written config, vocabulary, manifest or model
// where a good one stood: the content goes to a temporary file beside the
// target (NAME.tmp.PID: two processes never share one), is flushed to the
// disk, and only then renamed over the target; the folder is synced so the
// rename survives a power cut. On any failure the temporary file is removed
// and the target keeps its old content. Header-only: the data, train and
// core libraries all write files, and none of them sits below the others.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <ostream>
#include <string>
#include <string_view>

#include "core/error.h"

namespace roformer {

// fsync a file or a folder by path. A file that cannot be opened or synced
// throws; a folder's errors are ignored (some file systems refuse to sync one).
inline void fsync_path(const std::filesystem::path& path, bool is_directory = false) {
  const int fd =
      ::open(path.c_str(), (is_directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) {
    if (is_directory) return;
    throw Error(
        detail::concat("cannot open '", path.string(), "' to sync it: ", std::strerror(errno)));
  }
  const int r = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (r != 0 && !is_directory)
    throw Error(detail::concat("cannot sync '", path.string(), "': ", std::strerror(err)));
}

// Writes `path` through `write`, which fills the stream, as the header says.
// `what` names the file in messages ("config file", "vocab file"). A folder
// at `path` is an InputError (exit code 2: the user named it); a write,
// sync or rename that fails is an Error naming the file and the system's
// reason. A device or a pipe (/dev/stdout, /dev/null) is written in place:
// nothing can be renamed over it.
inline void write_file_atomically(const std::filesystem::path& path, std::string_view what,
                                  const std::function<void(std::ostream&)>& write) {
  namespace fs = std::filesystem;
  std::error_code status_ec;
  const fs::file_type type = fs::status(path, status_ec).type();
  if (type == fs::file_type::directory)
    throw InputError(
        detail::concat("cannot write ", what, " '", path.string(), "': it is a directory"));
  if (type == fs::file_type::character || type == fs::file_type::fifo ||
      type == fs::file_type::block) {
    std::ofstream out(path, std::ios::binary);
    write(out);
    out.flush();
    if (!out)
      throw Error(
          detail::concat("cannot write ", what, " '", path.string(), "': ", std::strerror(errno)));
    return;
  }
  fs::path tmp = path;
  tmp += ".tmp." + std::to_string(::getpid());
  // Removes the temporary file unless it was renamed: on every way out,
  // an exception from `write` included.
  struct Remove {
    const fs::path& tmp;
    bool armed = true;
    ~Remove() {
      std::error_code ec;
      if (armed) fs::remove(tmp, ec);
    }
  } remove{tmp};
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out)
      throw Error(
          detail::concat("cannot write ", what, " '", tmp.string(), "': ", std::strerror(errno)));
    write(out);
    out.flush();
    const int err = errno;
    if (!out)
      throw Error(
          detail::concat("cannot write ", what, " '", tmp.string(), "': ", std::strerror(err)));
  }
  fsync_path(tmp);
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec)
    throw Error(detail::concat("cannot rename ", what, " '", tmp.string(), "' to '", path.string(),
                               "': ", ec.message()));
  remove.armed = false;
  const fs::path dir = path.parent_path();
  fsync_path(dir.empty() ? fs::path(".") : dir, /*is_directory=*/true);
}

// The same for a text (or byte string) already in memory.
inline void write_file_atomically(const std::filesystem::path& path, std::string_view what,
                                  std::string_view text) {
  write_file_atomically(path, what, [text](std::ostream& out) {
    out.write(text.data(), std::streamsize(text.size()));
  });
}

}  // namespace roformer
