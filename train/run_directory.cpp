#include "train/run_directory.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/file_write.h"
#include "train/checkpoint.h"

namespace roformer {

namespace fs = std::filesystem;

RunDirectory::RunDirectory(fs::path dir, bool writer) : dir_(std::move(dir)) {
  if (!writer) return;
  std::error_code ec;
  fs::create_directories(checkpoints(), ec);
  if (ec)
    throw InputError(
        detail::concat("run.dir: cannot create ", checkpoints().string(), ": ", ec.message()));
  const fs::path lock_path = dir_ / ".lock";
  lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd_ < 0)
    throw InputError(detail::concat("run.dir: cannot open the lock file ", lock_path.string(), ": ",
                                    std::strerror(errno)));
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    std::string holder;
    std::ifstream(lock_path) >> holder;
    ::close(lock_fd_);
    lock_fd_ = -1;
    if (err == EWOULDBLOCK)
      throw InputError(detail::concat(
          "run.dir ", dir_.string(), " is in use by another training run (process ",
          holder.empty() ? std::string("unknown") : holder, ", holding ", lock_path.string(),
          "); wait for it to finish, stop it, or choose another run.dir"));
    throw InputError(
        detail::concat("run.dir: cannot lock ", lock_path.string(), ": ", std::strerror(err)));
  }
  // The holder's PID, for the message a second run prints.
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(lock_fd_, 0) != 0 ||
      ::pwrite(lock_fd_, pid.data(), pid.size(), 0) != ssize_t(pid.size()))
    spdlog::warn("could not write the PID into {}: {}", lock_path.string(), std::strerror(errno));
}

RunDirectory::~RunDirectory() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // closing the descriptor releases the flock
}

std::optional<fs::path> RunDirectory::checkpoint_to_resume(bool restart) const {
  std::vector<std::string> problems;
  if (auto latest = latest_valid_checkpoint(checkpoints(), &problems)) {
    for (const std::string& p : problems)
      spdlog::warn("skipping a checkpoint that does not load: {}", p);
    return latest;
  }
  if (problems.empty()) return std::nullopt;
  if (!restart) {
    std::ostringstream msg;
    msg << "cannot resume: none of the " << problems.size() << " checkpoint(s) in "
        << checkpoints().string() << " loads:";
    for (const std::string& p : problems) msg << "\n  " << p;
    msg << "\nrefusing to start from step 0 over them; pass --restart to set them aside (renamed "
           "*.unreadable) and train from scratch";
    throw InputError(msg.str());
  }
  for (const fs::path& p : list_checkpoints(checkpoints())) {
    fs::path aside = p;
    aside += ".unreadable";
    std::error_code ec;
    fs::rename(p, aside, ec);
    spdlog::warn("--restart: {} does not load; kept as {}", p.string(), aside.string());
  }
  return std::nullopt;
}

void RunDirectory::write_file(const std::string& name, const std::string& text) const {
  write_file_atomically(dir_ / name, "run file", text);
}

}  // namespace roformer
