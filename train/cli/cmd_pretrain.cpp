// roformer pretrain --config FILE [overrides]: the staged MLM pretraining.
// Pointed at a run directory with checkpoints, it resumes from the newest
// valid one. SIGINT/SIGTERM finish the current step, save and exit 0.
#include <spdlog/spdlog.h>

#include <iostream>

#include "train/cli/command.h"
#include "train/cli/launched_run.h"
#include "train/cli/trainer_options.h"
#include "train/preflight.h"
#include "train/pretrain.h"
#include "train/signals.h"

namespace {

class PretrainCommand : public roformer::cli::Command {
 public:
  std::string name() const override { return "pretrain"; }
  std::string description() const override {
    return "Masked-LM pretraining through the config's stages; resumes from the run "
           "directory's newest valid checkpoint";
  }
  void setup(CLI::App& app) override {
    app.add_flag("--restart", restart_,
                 "Start from step 0 when the run directory has checkpoints but none loads (they "
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
      roformer::preflight_pretrain(config, comm ? comm->world_size() : 1);
    roformer::StopRequest stop;
    roformer::PretrainOptions options =
        roformer::cli::trainer_options(inv, name(), &stop, restart_);
    options.communicator = comm;
    const roformer::PretrainResult r = roformer::run_pretrain(config, options);
    if (comm && comm->rank() != 0) return 0;
    if (r.interrupted) {
      std::cerr << "roformer: interrupted; checkpoint "
                << (r.last_checkpoint.empty() ? std::string("(none yet)")
                                              : r.last_checkpoint.string())
                << "\nresume with: " << options.resume_command << "\n";
      return 0;
    }
    std::cout << roformer::format_stage_table(r.stages);
    if (!r.last_checkpoint.empty())
      std::cout << "final checkpoint: " << r.last_checkpoint.string() << "\n";
    return 0;
  }

  bool restart_ = false;
};

}  // namespace

ROFORMER_REGISTER_COMMAND(PretrainCommand)
