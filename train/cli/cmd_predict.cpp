// roformer predict --checkpoint C --text "the [MASK] of the union" [--top-k 5] [--json]
#include <cstdio>
#include <iostream>

#include "core/error.h"
#include "train/cli/command.h"
#include "train/finetune.h"
#include "train/predict.h"
#include "train/run_precision.h"

namespace {

class PredictCommand : public roformer::cli::Command {
 public:
  std::string name() const override { return "predict"; }
  std::string description() const override {
    return "Fill-mask: the top-k tokens with probabilities at each [MASK] of --text";
  }
  roformer::cli::ConfigMode config_mode() const override {
    return roformer::cli::ConfigMode::kNone;
  }
  void setup(CLI::App& app) override {
    app.add_option("--checkpoint", checkpoint_, "Checkpoint file or run directory")->required();
    // Verbatim: no "[a,b]" list syntax (it would eat "[MASK]") and no comma splitting.
    app.add_option("--text", texts_, "Text with one or more [MASK] tokens (repeatable)")
        ->allow_extra_args(false)
        ->delimiter('\0');
    // Fine-tuned checkpoints: label + probabilities per example of a task file.
    app.add_option("--input", input_,
                   "Task file (JSON lines/TSV, fields as fine-tuned) to classify with a "
                   "fine-tuned checkpoint; writes one JSON object per example");
    app.add_option("--top-k", top_k_, "Candidates per mask (at most the vocabulary size)")
        ->check(CLI::Validator(
            [](const std::string& v) -> std::string {
              long long k = 0;
              return CLI::detail::lexical_cast(v, k) && k >= 1
                         ? std::string()
                         : "expected a positive integer, got " + v;
            },
            "INT>=1"));
    app.add_option("--vocab", vocab_, "vocab.txt (default: the one the checkpoint's config names)");
    app.add_flag("--json", json_, "One JSON object per text");
  }
  int run(const roformer::cli::Invocation&) override {
    if (!input_.empty()) {
      if (!texts_.empty()) throw roformer::InputError("predict: give --text or --input, not both");
      if (!roformer::is_finetuned_checkpoint(checkpoint_))
        throw roformer::InputError(
            "predict --input needs a fine-tuned checkpoint (roformer "
            "finetune); " +
            checkpoint_ +
            " is a pretraining checkpoint: "
            "use --text \"... [MASK] ...\" for fill-mask");
      const roformer::TaskModel model(checkpoint_);
      const roformer::RunPrecision precision(model.config());  // the checkpoint's run.precision
      model.predict(input_, std::cout);
      return 0;
    }
    if (texts_.empty())
      throw roformer::InputError("predict: --text (fill-mask) or --input (fine-tuned) is required");
    const roformer::FillMask fill(checkpoint_, vocab_);
    const roformer::RunPrecision precision(fill.config());  // the checkpoint's run.precision
    for (const std::string& text : texts_) {
      const auto masks = fill.predict(text, top_k_);
      if (json_) {
        std::cout << roformer::fill_mask_json(text, masks).dump() << "\n";
        continue;
      }
      std::cout << text << "\n";
      for (const auto& m : masks) {
        std::cout << "  [MASK] at " << m.index << ":";
        for (const auto& c : m.candidates) {
          char prob[32];
          std::snprintf(prob, sizeof prob, "%.3f", c.probability);
          std::cout << "  " << c.token << " (" << prob << ")";
        }
        std::cout << "\n";
      }
    }
    return 0;
  }

 private:
  std::string checkpoint_, vocab_;
  std::string input_;
  std::vector<std::string> texts_;
  int64_t top_k_ = 5;
  bool json_ = false;
};

}  // namespace

ROFORMER_REGISTER_COMMAND(PredictCommand)
