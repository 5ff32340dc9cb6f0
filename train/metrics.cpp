#include "train/metrics.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <iterator>
#include <utility>

#include "core/error.h"

namespace roformer {

MetricsLog::MetricsLog(const std::filesystem::path& jsonl_path, bool write_files, bool progress)
    : progress_(progress && ::isatty(STDERR_FILENO)) {
  if (!write_files) return;
  path_ = jsonl_path.string();
  file_ = std::fopen(jsonl_path.c_str(), "a");
  if (!file_)
    throw Error(detail::concat("cannot open metrics file ", jsonl_path.string(), ": ",
                               std::strerror(errno)));
  // Unbuffered: each record is one write(), so a failed one leaves nothing
  // in a buffer to be flushed later after the truncation below.
  std::setvbuf(file_, nullptr, _IONBF, 0);
  tensorboard_ = std::make_unique<TensorBoardWriter>(jsonl_path.parent_path() / "tb");
}

MetricsLog::~MetricsLog() {
  clear_progress();
  if (file_) std::fclose(file_);
}

void MetricsLog::run_before_write() {
  if (!write_error_.empty() || !before_write_) return;
  try {
    before_write_();
  } catch (const Error& e) {
    write_error_ = e.what();
    if (!defer_errors_) throw Error(std::exchange(write_error_, {}));
  }
}

void MetricsLog::write(const nlohmann::json& record) {
  run_before_write();
  if (!write_error_.empty() || !file_) return;
  const std::string line = record.dump() + "\n";
  const long before = std::ftell(file_);
  errno = 0;
  const bool ok =
      std::fwrite(line.data(), 1, line.size(), file_) == line.size() && std::fflush(file_) == 0;
  if (ok) {
    try {
      write_tensorboard(record);
      return;
    } catch (const Error& e) {
      write_error_ = e.what();
    }
  } else {
    // A full disk or an I/O error: drop the partial line so the file stays
    // valid JSON lines, and stop the caller rather than lose records silently.
    const int err = errno;
    std::clearerr(file_);
    if (before >= 0 && ::ftruncate(::fileno(file_), before) == 0) std::fseek(file_, 0, SEEK_END);
    write_error_ = detail::concat("cannot write metrics file ", path_, ": ",
                                  err ? std::strerror(err) : "write failed");
  }
  if (!defer_errors_) throw Error(std::exchange(write_error_, {}));
}

void MetricsLog::write_tensorboard(const nlohmann::json& record) {
  if (!tensorboard_ || !record.contains("global_step") || !record.contains("type")) return;
  std::string prefix = record["type"].get<std::string>();
  if (prefix == "validation" && record.contains("max_seq_len"))
    prefix += "/seq" + record["max_seq_len"].dump();
  const int64_t step = record["global_step"].get<int64_t>();
  for (const auto& [key, value] : record.items()) {
    if (key == "global_step" || key == "step_in_stage" || key == "stage") continue;
    if (value.is_number())
      tensorboard_->add_scalar(prefix + "/" + key, step, value.get<double>());
    else if (value.is_string() && key == "last_step_loss")  // kept exact as text in the JSON
      tensorboard_->add_scalar(prefix + "/" + key, step, std::stod(value.get<std::string>()));
  }
  tensorboard_->flush();
}

void MetricsLog::progress(const std::string& line) {
  if (!progress_) return;
  std::fprintf(stderr, "\r\033[K%s", line.c_str());
  std::fflush(stderr);
  progress_shown_ = true;
}

void MetricsLog::clear_progress() {
  if (!progress_shown_) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
  progress_shown_ = false;
}

std::string format_duration(double seconds) {
  if (!(seconds >= 0)) return "?";
  const long s = long(seconds + 0.5);
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, (s % 3600) / 60);
  } else if (s >= 60) {
    std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%lds", s);
  }
  return buf;
}

std::string format_count(double count) {
  if (!std::isfinite(count)) return "?";
  static constexpr const char* kUnits[] = {"", "k", "M", "G", "T", "P"};
  size_t unit = 0;
  double v = count;
  while (std::fabs(v) >= 1000 && unit + 1 < std::size(kUnits)) {
    v /= 1000;
    ++unit;
  }
  char buf[32];
  if (unit == 0)
    std::snprintf(buf, sizeof buf, "%.0f", v);
  else
    std::snprintf(buf, sizeof buf, std::fabs(v) < 100 ? "%.3g%s" : "%.0f%s", v, kUnits[unit]);
  return buf;
}

}  // namespace roformer
