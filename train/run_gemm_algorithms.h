// run.gemm_algorithms for one training run: how CUDA products choose their
// cuBLASLt algorithm, and, when chosen by timing, the run directory's table
// of those choices (core/gemm_table/gemm_table.h). A run loads its table
// before its first product and saves it whenever it grew, so a resumed run
// runs the algorithms of the run it continues, hence its bits. Each rank
// times and keeps its own: gemm_algorithms.rank<N>.json.
#pragma once

#include <cstdint>
#include <filesystem>

#include "train/config.h"

namespace roformer {

class RunGemmAlgorithms {
 public:
  // Sets the choice of `config.run.gemm_algorithms`; under timed, empties the
  // table and loads this rank's file from `run_dir` when there is one (an
  // unreadable one throws InputError naming it, and stays as it is).
  RunGemmAlgorithms(const Config& config, const std::filesystem::path& run_dir, int rank);
  // Under timed: saves what changed (a failure is logged, not thrown), and
  // goes back to the heuristic once no timed run is left in the process.
  ~RunGemmAlgorithms();
  RunGemmAlgorithms(const RunGemmAlgorithms&) = delete;
  RunGemmAlgorithms& operator=(const RunGemmAlgorithms&) = delete;

  // Under timed: writes the table (atomically) if it changed since loaded or
  // last saved; throws Error naming the file when it cannot. The trainer
  // calls it before a step's statistics are reduced, before every metrics
  // record and before every checkpoint.
  void save_if_changed();

  static std::filesystem::path file_name(int rank);

 private:
  bool timed_ = false;
  std::filesystem::path path_;
  uint64_t saved_generation_ = 0;
};

}  // namespace roformer
