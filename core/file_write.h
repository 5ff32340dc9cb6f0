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
// reason. A device, pipe or socket (/dev/null, a terminal) is written in
// place: nothing can be renamed over it. A symbolic link is followed: the
// file it names is replaced beside itself and the link stays (/dev/stdout
// redirected to a file writes that file).
inline void write_file_atomically(const std::filesystem::path& path, std::string_view what,
                                  const std::function<void(std::ostream&)>& write) {
  namespace fs = std::filesystem;
  // The reason of the call that just failed, read before anything else can
  // change errno (0 when a stream failed without a system call).
  auto reason = [](int err) { return err ? std::string(std::strerror(err)) : "write failed"; };
  fs::path target = path;
  std::error_code ec;
  if (fs::is_symlink(fs::symlink_status(path, ec))) {
    const fs::path resolved = fs::weakly_canonical(path, ec);
    if (!ec) target = resolved;
  }
  const fs::file_type type = fs::status(target, ec).type();
  if (type == fs::file_type::directory)
    throw InputError(
        detail::concat("cannot write ", what, " '", path.string(), "': it is a directory"));
  if (type == fs::file_type::character || type == fs::file_type::fifo ||
      type == fs::file_type::block || type == fs::file_type::socket) {
    std::ofstream out(path, std::ios::binary);
    int err = out ? 0 : errno;
    if (out) {
      write(out);
      out.flush();
      err = out ? 0 : errno;
    }
    if (!out)
      throw Error(detail::concat("cannot write ", what, " '", path.string(), "': ", reason(err)));
    return;
  }
  fs::path tmp = target;
  tmp += ".tmp." + std::to_string(::getpid());
  auto fail = [&](int err) {
    return Error(detail::concat("cannot write ", what, " '", path.string(), "' (through '",
                                tmp.string(), "'): ", reason(err)));
  };
  // Removes the temporary file unless it was renamed: on every way out,
  // an exception from `write` included.
  struct Remove {
    const fs::path& tmp;
    bool armed = true;
    ~Remove() {
      std::error_code ignored;
      if (armed) fs::remove(tmp, ignored);
    }
  } remove{tmp};
  {
    errno = 0;
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw fail(errno);
    write(out);
    out.flush();
    if (!out) throw fail(errno);
    out.close();
    if (!out) throw fail(errno);
  }
  fsync_path(tmp);
  fs::rename(tmp, target, ec);
  if (ec)
    throw Error(detail::concat("cannot rename ", what, " '", tmp.string(), "' to '",
                               target.string(), "': ", ec.message()));
  remove.armed = false;
  const fs::path dir = target.parent_path();
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
