// Staged MLM pretraining (`roformer pretrain`): the stages of the config in
// order, each at its own sequence length and global batch, run by the shared
// Trainer (train/trainer.h) with the masked-LM task defined here: packed,
// masked batches from the shard loader, the loss over masked tokens, periodic
// validation, and the per-stage summary table.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "train/config.h"
#include "train/trainer.h"

namespace roformer {

struct StageSummary {
  int64_t stage = 0, max_seq_len = 0, batch_size = 0, steps = 0;
  double train_loss = 0, train_accuracy = 0;  // over the stage's last log window
  double val_loss = 0, val_accuracy = 0;      // at the stage's end (NaN: no validation data)
  double peak_allocated_mb = 0;               // allocator peak within the stage (NaN: unknown)
  double peak_rss_mb = 0;                     // process peak RSS at the stage's end
};

struct PretrainResult {
  int64_t global_step = 0;
  bool finished = false;     // every stage done
  bool interrupted = false;  // stopped by a signal, checkpoint written
  std::filesystem::path last_checkpoint;
  std::vector<StageSummary> stages;
};

using PretrainOptions = TrainerOptions;

PretrainResult run_pretrain(const Config& config, const PretrainOptions& options = {});

// The paper-style table of stages (stage, max length, batch, steps, loss,
// accuracy) with each stage's peak memory.
std::string format_stage_table(const std::vector<StageSummary>& stages);

}  // namespace roformer
