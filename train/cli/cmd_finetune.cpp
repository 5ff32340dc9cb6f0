// roformer finetune --config FILE [key=value ...]
#include <spdlog/spdlog.h>

#include "train/cli/command.h"
#include "train/cli/launched_run.h"
#include "train/cli/trainer_options.h"
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
  void setup(CLI::App& app) override {
    app.add_flag("--restart", restart_,
                 "Start from scratch when the run directory has checkpoints but none loads (they "
                 "are kept, renamed *.unreadable)");
  }
  int run(const roformer::cli::Invocation& inv) override {
    roformer::cli::LaunchedRun launched(*inv.config);
    return launched.run([&] { return run_rank(inv, launched.config(), launched.communicator()); });
  }

 private:
  int run_rank(const roformer::cli::Invocation& inv, const roformer::Config& config,
               roformer::Communicator* comm) {
    if (!comm || comm->rank() == 0)
      roformer::preflight_finetune(config, comm ? comm->world_size() : 1);
    const roformer::StopRequest stop;
    roformer::FinetuneOptions options =
        roformer::cli::trainer_options(inv, name(), &stop, restart_);
    options.communicator = comm;
    const roformer::FinetuneResult r = roformer::run_finetune(config, options);
    if (comm && comm->rank() != 0) return r.interrupted ? 130 : 0;
    if (r.interrupted) {
      spdlog::warn("interrupted; resume with: {}", options.resume_command);
      return 130;
    }
    if (r.best_validation_accuracy >= 0)
      spdlog::info("best validation accuracy {:.2f}%: {}", 100 * r.best_validation_accuracy,
                   r.best_checkpoint.string());
    else
      spdlog::info("model of the last epoch: {}", r.best_checkpoint.string());
    return 0;
  }

  bool restart_ = false;
};

}  // namespace

ROFORMER_REGISTER_COMMAND(FinetuneCommand)
