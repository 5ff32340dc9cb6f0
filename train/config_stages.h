// What a pretraining stage runs with once its own keys and the top-level
// ones are merged (docs/config.md, "Stages"): its length and duration, the
// batch-size warm-up, the learning-rate schedule, masking, the RoPE base,
// weight decay and data. The trainer, the stage banner and --print-config
// all read stages through resolve_stage, so they agree.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "layers/model_config.h"
#include "optim/lr_schedule.h"
#include "train/config.h"

namespace roformer {

// A batch-size warm-up level: the steps before `end_step` (counted in the
// stage, after the previous level's) run with a global batch of `batch`.
struct BatchLevel {
  int64_t end_step = 0;
  int64_t batch = 0;
  bool operator==(const BatchLevel&) const = default;
};

// Most levels a batch warm-up climbs through: with more micro-batch sizes
// between start and end, the increments are multiples of micro_batch_size.
inline constexpr int64_t kMaxBatchLevels = 64;

struct ResolvedStage {
  int64_t index = 0;  // 0-based
  int64_t max_seq_len = 0, batch_size = 0, micro_batch_size = 0, steps = 0;
  std::optional<double> tokens;                 // the budget, when the stage was given in tokens
  std::vector<BatchLevel> warm_up;              // empty: the full batch from the first step
  double batch_warmup_tokens = 0;               // what warm_up spans (0: none)
  double lr = 0;                                // peak
  int64_t rewarmup_steps = 0;                   // re-warm-up within the run's schedule
  std::optional<optim::ScheduleSpec> schedule;  // the stage's own schedule
  double weight_decay = 0, mask_prob = 0, rope_base = 0;
  std::string shard_dir;

  // Global batch (sequences) of step `step` of the stage (0-based).
  int64_t batch_at(int64_t step) const;
  // Nominal tokens (batch x max_seq_len) of the stage's first `step` steps.
  double tokens_through(int64_t step) const;
};

ResolvedStage resolve_stage(const Config& config, size_t index);

// "max_seq_len 1024, batch 64 (warm-up from 16 over 1e+06 tokens), 120 steps
// (from 7.9e+06 tokens), lr 1e-3 wsd 1-sqrt ..." for the stage banner.
std::string describe_stage(const ResolvedStage& stage);
// One "# stage N: ..." comment line per stage, appended to --print-config.
std::string describe_stages_as_comments(const Config& config);

// The steps that hold the run's last `tokens` tokens; nullopt when the run
// holds fewer (optim.decay_tokens).
std::optional<int64_t> steps_of_last_tokens(const Config& config, double tokens);

// The run-wide schedule of the optim section (decay_tokens made steps).
optim::ScheduleSpec run_schedule(const Config& config);

// The run's learning-rate schedule over global steps, with every stage's
// peak, re-warm-up or own schedule.
optim::LrSchedule make_lr_schedule(const Config& config);

// For the config reader: fills in what a stage derives (micro_batch_size,
// steps from tokens) and returns the first problem of the stage alone, naming
// its keys. `optim` gives the inherited schedule keys.
std::optional<ConfigIssue> derive_stage(StageConfig& stage, const OptimConfig& optim);
// The levels of a batch warm-up; empty when the stage has none.
std::vector<BatchLevel> batch_warmup_levels(const StageConfig& stage);

}  // namespace roformer
