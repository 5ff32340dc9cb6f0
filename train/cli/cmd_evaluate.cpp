// roformer evaluate --checkpoint C [--config FILE] [--split test|validation] [--json]
#include <iostream>

#include "core/error.h"
#include "train/cli/command.h"
#include "train/finetune.h"
#include "train/run_precision.h"

namespace {

class EvaluateCommand : public roformer::cli::Command {
 public:
  std::string name() const override { return "evaluate"; }
  std::string description() const override {
    return "Accuracy, macro-F1 and confusion matrix of a fine-tuned checkpoint on a task split";
  }
  roformer::cli::ConfigMode config_mode() const override {
    return roformer::cli::ConfigMode::kOptional;
  }
  void setup(CLI::App& app) override {
    app.add_option("--checkpoint", checkpoint_,
                   "Fine-tuned checkpoint, or its run directory (uses best.h5)")
        ->required();
    app.add_option("--split", split_, "Which file of the finetune section")
        ->check(CLI::IsMember({"test", "validation", "train"}));
    app.add_option("--file", file_, "Evaluate this task file instead of a split");
    app.add_flag("--json", json_, "Print the report as JSON");
  }
  int run(const roformer::cli::Invocation& inv) override {
    const roformer::TaskModel model(checkpoint_);
    // Files and fields from --config when given, else from the checkpoint's run.
    const roformer::Config& config =
        inv.config && inv.config->finetune ? *inv.config : model.config();
    if (!inv.config && !inv.overrides.empty())
      throw roformer::InputError("evaluate: key=value overrides need --config");
    const roformer::FinetuneConfig& spec = *config.finetune;
    std::string path = file_;
    if (path.empty()) {
      path = split_ == "test"         ? spec.test_file
             : split_ == "validation" ? spec.validation_file
                                      : spec.train_file;
      if (path.empty())
        throw roformer::InputError(config.source + ": finetune." + split_ +
                                   "_file is not set (or pass --file)");
    }
    // run.precision of the config in use (--config, else the checkpoint's run).
    const roformer::RunPrecision precision(config);
    const roformer::EvalReport report = model.evaluate(path, spec);
    if (json_)
      std::cout << roformer::eval_report_json(report).dump() << "\n";
    else
      std::cout << roformer::format_eval_report(report);
    return 0;
  }

 private:
  std::string checkpoint_, split_ = "test", file_;
  bool json_ = false;
};

}  // namespace

ROFORMER_REGISTER_COMMAND(EvaluateCommand)
