// Checkpoints: one HDF5 file per save, written to a temporary name, flushed,
// fsynced and renamed (data/hdf5.h AtomicFile), so a crash mid-write never
// damages an existing checkpoint. docs/formats.md describes the layout.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "data/loader.h"
#include "layers/module.h"

namespace roformer {

constexpr int64_t kCheckpointFormatVersion = 1;

// Everything besides the tensors that a resumed run needs to continue exactly.
struct TrainingState {
  int64_t global_step = 0;    // optimizer updates done (skipped steps included)
  int64_t stage = 0;          // stage in progress (== number of stages when finished)
  int64_t step_in_stage = 0;  // steps done within that stage
  uint64_t rng_seed = 0;      // the dropout seed (draws are keyed by seed and step)
  uint64_t rng_offset = 0;    // unused since dropout is keyed by step; kept in the format
  data::LoaderState loader;   // the training stream's cursor
  int64_t nonfinite_skipped = 0;
  int64_t nonfinite_in_a_row = 0;
  bool stage_end = false;     // saved at the end of a stage (kept by pruning)
  std::string stage_results;  // JSON array: per finished stage, its summary row
  bool operator==(const TrainingState&) const = default;
};

struct CheckpointData {
  TrainingState state;
  StateDict parameters;  // f32, under their Hugging Face names
  Tensor exp_avg;        // AdamW moments, flat f32 in parameter order
  Tensor exp_avg_sq;
  int64_t optimizer_step = 0;
  std::string config_yaml;  // the resolved config of the run that wrote it
  std::string created_by;
};

// Writes `path` atomically. Throws Error if a parameter or moment is not
// finite: a checkpoint never holds NaN.
void save_checkpoint(const std::filesystem::path& path, const CheckpointData& data);

// Reads and verifies a checkpoint (format version, every dataset's checksum
// and size). Throws InputError naming the file and what is wrong.
// `with_optimizer` false skips the moments (fine-tuning, prediction).
CheckpointData load_checkpoint(const std::filesystem::path& path, bool with_optimizer = true);

// "ckpt-00001200.h5" (+ "-stage2-end" before the extension for stage ends).
std::string checkpoint_file_name(int64_t global_step, std::optional<int64_t> stage_end);

// Checkpoint files in `dir`, oldest first (by global step).
std::vector<std::filesystem::path> list_checkpoints(const std::filesystem::path& dir);

// The newest checkpoint in `dir` that loads; files that do not are reported
// in `problems` ("ckpt-...h5: <why>") and skipped. nullopt when none loads.
std::optional<std::filesystem::path> latest_valid_checkpoint(const std::filesystem::path& dir,
                                                             std::vector<std::string>* problems);

// Deletes all but the newest `keep_last` checkpoints (0: keep all); stage-end
// checkpoints are kept when `keep_stage_ends`. Leftover temporary files from
// an interrupted write are removed too.
void prune_checkpoints(const std::filesystem::path& dir, int64_t keep_last, bool keep_stage_ends);

// `roformer inspect CHECKPOINT`: step, stage, config, parameter counts.
std::string describe_checkpoint(const std::filesystem::path& path);

// A checkpoint path given by the user: a file, or a run directory (its
// newest valid checkpoint). Throws InputError when there is none.
std::filesystem::path resolve_checkpoint(const std::filesystem::path& path_or_run_dir);

}  // namespace roformer
