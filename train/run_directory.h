// The run directory of a training run (`run.dir`): config.yaml, metrics.jsonl,
// checkpoints/ and a lock file. It decides where a run resumes from, and it
// keeps a second process out while a run writes there.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

namespace roformer {

class RunDirectory {
 public:
  // Creates `dir` and `dir/checkpoints` and takes an exclusive lock on
  // `dir/.lock` when `writer` (rank 0); the lock lives as long as the object
  // and is released by the kernel if the process dies. Throws InputError when
  // the directory cannot be created or another process holds the lock (its
  // PID is named).
  RunDirectory(std::filesystem::path dir, bool writer);
  ~RunDirectory();
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;

  const std::filesystem::path& dir() const { return dir_; }
  std::filesystem::path checkpoints() const { return dir_ / "checkpoints"; }

  // The checkpoint a run continues from: the newest that loads (unloadable
  // newer ones are logged and skipped). nullopt when the directory holds no
  // checkpoint. When it holds checkpoints and none loads, throws InputError
  // naming each file and why, unless `restart`: then they are renamed to
  // "<name>.unreadable" (kept for inspection, out of pruning's way) and the
  // run starts from step 0.
  std::optional<std::filesystem::path> checkpoint_to_resume(bool restart) const;

  // Writes `text` to dir/name atomically (temporary file + rename); throws
  // InputError naming the file when it cannot.
  void write_file(const std::string& name, const std::string& text) const;

 private:
  std::filesystem::path dir_;
  int lock_fd_ = -1;
};

}  // namespace roformer
