// One training loop for pretraining and fine-tuning (docs/architecture.md,
// "The Trainer"). Per optimizer step:
//
//   fetch this rank's micro-batches -> all-reduce their loss units (masked
//   tokens or examples) -> forward + backward of each micro-batch, its loss
//   weighted by units / global units -> (gradient all-reduce) -> global norm
//   -> all-reduce "non-finite?" -> clip + AdamW, or skip -> log -> evaluate ->
//   checkpoint -> all-reduce "stop?".
//
// The task (MLM pretraining, classification fine-tuning) supplies what
// differs: its batches and metrics, its phases (stages or epochs), what its
// checkpoints hold besides the model and optimizer, and its evaluation.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/dropout_context.h"
#include "data/loader.h"
#include "layers/module.h"
#include "optim/lr_schedule.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/metrics.h"

namespace roformer {

class Communicator;
class FlatParameters;
class RunGemmAlgorithms;
class StopRequest;

// One phase of a run: a pretraining stage or a fine-tuning epoch.
struct PhasePlan {
  int64_t steps = 0;             // optimizer steps
  int64_t micro_batches = 1;     // forward/backward passes per step on this rank
  int64_t micro_batch_size = 0;  // sequences per micro-batch (rows of the global batch)
  int64_t tokens_per_step = 0;   // an upper bound, for the ETA (at the full batch)
  double weight_decay = NAN;     // this phase's AdamW weight decay (NaN: optim.weight_decay)
  double token_budget = 0;       // > 0: the phase was given in tokens (progress says so)
};

// Sums over micro-batches (and, after reduction, over ranks).
struct StepStats {
  double loss_sum = 0;  // per-unit loss x units
  int64_t units = 0;    // masked tokens (MLM) or examples (classification)
  int64_t correct = 0;  // predictions equal to the label
  int64_t tokens = 0;   // non-padding tokens
  int64_t slots =
      0;  // the slots of the padded rows (packing efficiency = tokens / slots); 0: tokens
  double flops = 0;  // model FLOPs of forward + backward (for MFU; 0: unknown)
};

// Training loss and accuracy of a phase, for its summary.
struct PhaseTraining {
  double window_loss = NAN, window_accuracy = NAN;  // the last log window
  double loss = NAN, accuracy = NAN;                // every step of the phase run here
};

struct CheckpointPolicy {
  // false: checkpoints only at phase ends; an interrupted phase is rerun from its start.
  bool within_phase = true;
  bool mark_phase_ends = true;  // "ckpt-N-stageK-end.h5" names
  int64_t keep_last = 3;        // pruning (0: keep all)
  bool keep_phase_ends = true;
};

class TrainingTask {
 public:
  virtual ~TrainingTask() = default;

  virtual Module& model() = 0;
  // "roformer pretrain", "roformer finetune (task: pair)": checkpoints' created_by.
  virtual std::string created_by() const = 0;
  // The resolved config as saved in the run directory and checkpoints.
  virtual std::string config_yaml() const = 0;
  // Throws InputError when a checkpoint written under `saved` cannot continue
  // this run (another model, task, ...), naming what differs.
  virtual void check_resume(const Config& saved, const std::string& checkpoint,
                            const TrainingState& state) const = 0;

  virtual std::string phase_name() const = 0;  // "stage", "epoch"
  virtual int64_t num_phases() const = 0;
  virtual PhasePlan plan(int64_t phase) const = 0;
  // Nominal tokens of the phase's first `steps` steps (for the ETA and the
  // progress in tokens): steps x tokens_per_step unless the batch varies.
  virtual double phase_tokens(int64_t phase, int64_t steps) const {
    return double(steps) * double(plan(phase).tokens_per_step);
  }
  virtual CheckpointPolicy checkpoint_policy() const = 0;
  virtual std::string accuracy_key() const = 0;  // "mlm_accuracy", "accuracy"
  // The learning-rate schedule over global steps, and the key and value of
  // the peak lr (named in the advice after a divergence).
  virtual optim::LrSchedule lr_schedule() const = 0;
  virtual std::pair<std::string, double> lr_setting() const = 0;

  // Prepares the phase `state.stage`, at `state.step_in_stage` steps in.
  virtual void begin_phase(const TrainingState& state, MetricsLog& metrics) = 0;
  // Draws this rank's micro-batches of the next step; returns the loss units of each.
  virtual std::vector<int64_t> fetch() = 0;
  // Forward and backward of fetched micro-batch `i`, its mean loss weighted by
  // its units times `inv_global_units` before backward, so the gradients are
  // those of the mean over the global batch. Returns its unweighted stats.
  // `dropout` is keyed by (seed, step, the micro-batch's first row in the
  // global batch), so the micro-batch split does not change the masks.
  virtual StepStats forward_backward(size_t i, double inv_global_units, DropoutContext dropout) = 0;
  // The data cursor after the last fetch(), saved in checkpoints.
  virtual data::LoaderState cursor() const { return {}; }

  // Validation inside a phase, every log.eval_every_steps (a no-op for tasks
  // that validate only at phase ends).
  virtual void evaluate_within_phase(const TrainingState&, MetricsLog&) {}
  // The phase `state.stage` is done: validate, summarise.
  virtual void end_phase(const TrainingState& state, const PhaseTraining& training,
                         MetricsLog& metrics) = 0;
  // True once the task wants no more phases (early stopping; kept in save_extra).
  virtual bool stop_early() const { return false; }

  // Task state kept in checkpoints (summaries, best score, ...), as JSON.
  virtual std::string save_extra() const = 0;
  virtual void load_extra(const std::string& json) = 0;
};

struct TrainerOptions {
  const StopRequest* stop = nullptr;     // SIGINT/SIGTERM: finish the step, save, return
  Communicator* communicator = nullptr;  // null: a single process
  bool restart = false;                  // start from step 0 when no checkpoint in run.dir loads
  // The command that continues this run ("roformer pretrain --config x.yaml
  // optim.lr=3e-4"), for the advice printed on stop and on divergence.
  std::string resume_command;
  // Test hooks (fault injection): called before each step with the global step
  // about to run, and inside each checkpoint write just before it is committed.
  std::function<void(int64_t global_step)> before_step;
  std::function<void(int64_t global_step)> before_checkpoint_commit;
  // Called once the step's gradients are summed over the ranks, before the
  // norm: a test may poison this rank's gradient there.
  std::function<void(int64_t global_step, const FlatParameters& flat)> after_gradients;
};

struct TrainerResult {
  TrainingState state;
  bool finished = false;     // every phase done (or stopped early by the task)
  bool interrupted = false;  // stopped by a signal
  std::filesystem::path last_checkpoint;
  // The run's metrics.jsonl and TensorBoard log, still open once finished,
  // for records written after training (fine-tuning's test scores).
  std::unique_ptr<MetricsLog> metrics;
};

// "model.hidden_size: 32 in the checkpoint, 64 in the config", one per model
// key that differs between a checkpoint's config and this run's.
std::vector<std::string> model_differences(const Config& saved, const Config& now);

// Memory of the process now: the CPU allocator's counters and the peak RSS.
struct MemoryUsage {
  double allocated_mb = 0, cached_mb = 0, peak_allocated_mb = 0, peak_rss_mb = 0;
};
MemoryUsage memory_usage();

class Trainer {
 public:
  Trainer(const Config& config, TrainingTask& task, TrainerOptions options);
  // Resumes from run.dir's newest valid checkpoint, trains to the end or a
  // stop, and returns where it stands. Throws Error after too many
  // non-finite steps in a row (naming the checkpoint to resume from).
  TrainerResult run();

 private:
  const Config& config_;
  TrainingTask& task_;
  TrainerOptions options_;
  // run.gemm_algorithms (train/run_gemm_algorithms.h), from run() on.
  std::shared_ptr<RunGemmAlgorithms> gemm_algorithms_;
};

}  // namespace roformer
