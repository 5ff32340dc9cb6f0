// roformer predict --checkpoint C --text "the [MASK] of the union" [--top-k 5] [--json]
#include <cstdio>
#include <iostream>

#include "train/cli/command.h"
#include "train/predict.h"

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
    app.add_option("--text", texts_, "Text with one or more [MASK] tokens (repeatable)")
        ->required();
    app.add_option("--top-k", top_k_, "Candidates per mask")->check(CLI::PositiveNumber);
    app.add_option("--vocab", vocab_, "vocab.txt (default: the one the checkpoint's config names)");
    app.add_flag("--json", json_, "One JSON object per text");
  }
  int run(const roformer::cli::Invocation&) override {
    const roformer::FillMask fill(checkpoint_, vocab_);
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
  std::vector<std::string> texts_;
  int64_t top_k_ = 5;
  bool json_ = false;
};

}  // namespace

ROFORMER_REGISTER_COMMAND(PredictCommand)
