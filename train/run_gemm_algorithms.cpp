#include "train/run_gemm_algorithms.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <atomic>

#include "core/gemm_table/gemm_table.h"

namespace roformer {

namespace fs = std::filesystem;

namespace {
// Timed runs alive in this process: the choice goes back to the heuristic
// when the last one ends (a trainer's run may outlive the next one's start).
std::atomic<int> g_timed_runs{0};
}  // namespace

fs::path RunGemmAlgorithms::file_name(int rank) {
  return fmt::format("gemm_algorithms.rank{}.json", rank);
}

RunGemmAlgorithms::RunGemmAlgorithms(const Config& config, const fs::path& run_dir, int rank)
    : timed_(config.run.gemm_algorithms == GemmAlgorithmChoice::kTimed),
      path_(run_dir / file_name(rank)) {
  set_gemm_algorithm_choice(GemmAlgorithmChoice::kHeuristic);
  if (!timed_) return;
  clear_gemm_table();
  std::error_code ec;
  if (fs::exists(path_, ec)) {
    load_gemm_table(path_);
    spdlog::info("run.gemm_algorithms timed: {} products' algorithms from {}", gemm_table_size(),
                 path_.string());
  } else {
    spdlog::info(
        "run.gemm_algorithms timed: each product's first run times cuBLASLt's candidates; the "
        "choices go to {}",
        path_.string());
  }
  saved_generation_ = gemm_table_generation();
  set_gemm_algorithm_choice(GemmAlgorithmChoice::kTimed);
  ++g_timed_runs;
}

RunGemmAlgorithms::~RunGemmAlgorithms() {
  if (!timed_) return;
  try {  // what was timed after the last record (a final evaluation)
    save_if_changed();
  } catch (const std::exception& e) {
    spdlog::warn("{}", e.what());
  }
  if (--g_timed_runs == 0) set_gemm_algorithm_choice(GemmAlgorithmChoice::kHeuristic);
}

void RunGemmAlgorithms::save_if_changed() {
  if (!timed_) return;
  const uint64_t generation = gemm_table_generation();
  if (generation == saved_generation_) return;
  std::error_code ec;  // a folder that cannot be made: the save names the file
  fs::create_directories(path_.parent_path(), ec);
  save_gemm_table(path_);
  saved_generation_ = generation;
}

}  // namespace roformer
