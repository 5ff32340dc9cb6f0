// Training metrics: a console line through spdlog every N steps (with a
// one-line progress bar when stderr is a terminal) and the same record
// appended to metrics.jsonl in the run directory, for plots and tools, and
// its numbers as TensorBoard scalars in the run directory's tb/.
#pragma once

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "train/tensorboard.h"

namespace roformer {

class MetricsLog {
 public:
  // Appends to `jsonl_path` (created if missing) and starts a TensorBoard
  // events file in its directory's tb/; `write_files` is false on ranks
  // other than 0. `progress`: draw a progress line on a terminal.
  MetricsLog(const std::filesystem::path& jsonl_path, bool write_files, bool progress);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  // One JSON object per line, flushed so a killed run keeps what it logged.
  // A record with a global_step also becomes TensorBoard scalars: each
  // numeric field as "<type>/<field>" ("validation/seq<L>/<field>" for a
  // validation at length L). A failed write (a full disk) leaves no partial
  // line and throws Error, or, with deferred errors, is kept in
  // write_error() and every later write is skipped.
  void write(const nlohmann::json& record);
  // The trainer defers write errors and checks write_error() after each
  // step: it then saves a checkpoint before it stops, and every rank stops
  // at the same step.
  void set_defer_write_errors(bool on) { defer_errors_ = on; }
  const std::string& write_error() const { return write_error_; }
  // Runs before every record, on every rank (the trainer saves the GEMM
  // algorithm table there); an Error it throws fails the write as a full
  // disk would, and the record is not written.
  void set_before_write(std::function<void()> hook) { before_write_ = std::move(hook); }
  // Runs that hook now, as a record would (the trainer, before a step's
  // statistics are reduced over the ranks), its failure handled as a
  // write's; nothing after a failed write.
  void run_before_write();
  // Redraws the progress line (no-op without a terminal).
  void progress(const std::string& line);
  // Ends the progress line before a normal log line is printed.
  void clear_progress();

 private:
  void write_tensorboard(const nlohmann::json& record);
  std::FILE* file_ = nullptr;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  std::string path_;
  bool progress_ = false;
  bool progress_shown_ = false;
  bool defer_errors_ = false;
  std::string write_error_;
  std::function<void()> before_write_;
};

// "1h02m", "3m05s", "12s": for elapsed and ETA columns.
std::string format_duration(double seconds);
// "950", "12.3k", "4.50M", "2.50G", "1.20T": token counts in log lines.
std::string format_count(double count);

}  // namespace roformer
