// The staged MLM pretraining loop (`roformer pretrain`): the stages of the
// config in order, each at its own sequence length and global batch, with
// gradient accumulation over micro-batches, AdamW with a run-wide schedule,
// periodic validation, checkpoints, and exact resume from the newest valid
// checkpoint in the run directory.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "train/config.h"

namespace roformer {

class StopRequest;

struct StageSummary {
  int64_t stage = 0, max_seq_len = 0, batch_size = 0, steps = 0;
  double train_loss = 0, train_accuracy = 0;  // over the stage's last log window
  double val_loss = 0, val_accuracy = 0;      // at the stage's end (NaN: no validation data)
};

struct PretrainResult {
  int64_t global_step = 0;
  bool finished = false;     // every stage done
  bool interrupted = false;  // stopped by a signal, checkpoint written
  std::filesystem::path last_checkpoint;
  std::vector<StageSummary> stages;
};

struct PretrainOptions {
  const StopRequest* stop = nullptr;  // SIGINT/SIGTERM: finish the step, save, return
  int rank = 0;                       // data-parallel rank (only rank 0 writes files)
  int world_size = 1;
};

PretrainResult run_pretrain(const Config& config, const PretrainOptions& options = {});

// The paper-style table of stages (stage, max length, batch, steps, loss, accuracy).
std::string format_stage_table(const std::vector<StageSummary>& stages);

}  // namespace roformer
