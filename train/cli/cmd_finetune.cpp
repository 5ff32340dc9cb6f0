// roformer finetune --config FILE [key=value ...]
#include <spdlog/spdlog.h>

#include "train/cli/command.h"
#include "train/finetune.h"
#include "train/preflight.h"
#include "train/signals.h"

namespace {

class FinetuneCommand : public roformer::cli::Command {
 public:
  std::string name() const override { return "finetune"; }
  std::string description() const override {
    return "Fine-tune on a classification, pair or triplet task (the config's finetune section)";
  }
  void setup(CLI::App&) override {}
  int run(const roformer::cli::Invocation& inv) override {
    roformer::preflight_finetune(*inv.config);
    const roformer::StopRequest stop;
    roformer::FinetuneOptions options;
    options.stop = &stop;
    const roformer::FinetuneResult r = roformer::run_finetune(*inv.config, options);
    if (r.interrupted) return 130;
    if (r.best_validation_accuracy >= 0)
      spdlog::info("best validation accuracy {:.2f}%: {}", 100 * r.best_validation_accuracy,
                   r.best_checkpoint.string());
    else
      spdlog::info("model of the last epoch: {}", r.best_checkpoint.string());
    return 0;
  }
};

}  // namespace

ROFORMER_REGISTER_COMMAND(FinetuneCommand)
