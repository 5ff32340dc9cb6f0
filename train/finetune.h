// Fine-tuning on downstream tasks (docs/finetune.md):
//   classification: [CLS] text [SEP] -> classifier head -> label
//   pair:           [CLS] a [SEP] b [SEP] (token types 0/1) -> label
//   triplet:        (A, B, C), CAIL2019-SCM style: a 1-logit head scores the
//                   pairs (A, B) and (A, C); label 0 ("B") when s_AB > s_AC;
//                   loss = cross-entropy over [s_AB, s_AC].
// run_finetune loads roformer.* from finetune.init_checkpoint (or starts from
// random weights), adds a fresh head, and trains it with the shared Trainer
// (train/trainer.h; AdamW + linear warm-up and decay, one phase per epoch),
// evaluates on the validation file every epoch, keeps the best model as
// <run.dir>/best.h5, and checkpoints every epoch in <run.dir>/checkpoints; a
// rerun resumes at the start of the interrupted epoch.
#pragma once

#include <filesystem>
#include <iosfwd>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "train/config.h"
#include "train/trainer.h"

namespace roformer {

class StopRequest;

struct EvalReport {
  std::string path;
  std::vector<std::string> labels;
  int64_t examples = 0;
  int64_t truncated = 0;
  double loss = 0;
  double accuracy = 0;
  double macro_f1 = 0;
  std::vector<std::vector<int64_t>> confusion;  // [true label][predicted label]
};

// Accuracy, per-label F1 averaged over labels (a label never true nor
// predicted counts F1 = 0 only if it appears; labels absent from both are
// left out) and the confusion matrix, from true and predicted indices.
EvalReport score_predictions(const std::vector<int32_t>& truth,
                             const std::vector<int32_t>& predicted,
                             const std::vector<std::string>& labels);
std::string format_eval_report(const EvalReport& report);
nlohmann::json eval_report_json(const EvalReport& report);

// Triplet scoring: pair scores [2B, 1] of rows (A_0,B_0), (A_0,C_0), (A_1,B_1),
// ... -> [B, 2] = [s_AB, s_AC] per example; label 0 (B closer) when
// s_AB > s_AC, and the loss is cross-entropy over the two columns.
Tensor triplet_scores(const Tensor& pair_scores);

// The stop request, --restart, the resume command and test hooks (train/trainer.h).
using FinetuneOptions = TrainerOptions;

struct FinetuneResult {
  bool finished = false;
  bool interrupted = false;
  int64_t epochs_done = 0;
  double best_validation_accuracy = -1;  // -1: no validation file
  std::filesystem::path best_checkpoint;
  std::optional<EvalReport> validation;  // of the best model
  std::optional<EvalReport> test;        // of the best model, when test_file is set
};

FinetuneResult run_finetune(const Config& config, const FinetuneOptions& options = {});

// A fine-tuned checkpoint, ready to score task files.
class TaskModel {
 public:
  // `checkpoint`: a fine-tuned checkpoint file or run directory (best.h5 of a
  // run directory is preferred), its model on `device` (checked by the
  // caller: train/run_device.h). Throws InputError for a pretraining checkpoint.
  explicit TaskModel(const std::filesystem::path& checkpoint, Device device = Device::cpu());
  ~TaskModel();
  TaskModel(const TaskModel&) = delete;
  TaskModel& operator=(const TaskModel&) = delete;

  const Config& config() const;  // the fine-tuning run's resolved config
  const std::vector<std::string>& labels() const;
  // Evaluates a labelled task file (fields as in `spec`, usually config().finetune).
  EvalReport evaluate(const std::string& path, const FinetuneConfig& spec) const;
  // Writes one JSON object per example of an (unlabelled) task file:
  // {"line": n, "label": "...", "probabilities": {"label": p, ...}}.
  int64_t predict(const std::string& path, std::ostream& out) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// True when `checkpoint` (file or run directory) was written by finetune.
bool is_finetuned_checkpoint(const std::filesystem::path& checkpoint);

}  // namespace roformer
