// roformer config --config FILE [--for COMMAND] [-o OUT] [key=value...]:
// validates a config and prints it resolved, so a typo shows up before a run.
#include <spdlog/spdlog.h>

#include <iostream>

#include "train/cli/command.h"
#include "train/config.h"

namespace {

class ConfigCommand : public roformer::cli::Command {
 public:
  std::string name() const override { return "config"; }
  std::string description() const override {
    return "Validate a config and print it resolved (defaults filled in, overrides applied)";
  }
  void setup(CLI::App& app) override {
    app.add_option("--for", for_command_,
                   "Also require the keys this command needs (e.g. data.vocab for pretrain)")
        ->check(CLI::IsMember({"prepare", "pretrain", "finetune"}));
    app.add_option("-o,--output", output_, "Write the resolved YAML to this file instead of stdout")
        ->type_name("FILE");
  }
  int run(const roformer::cli::Invocation& inv) override {
    const roformer::Config& config = *inv.config;
    if (for_command_ == "prepare") roformer::require_for(config, roformer::ConfigUse::kPrepare);
    if (for_command_ == "pretrain") roformer::require_for(config, roformer::ConfigUse::kPretrain);
    if (for_command_ == "finetune") roformer::require_for(config, roformer::ConfigUse::kFinetune);
    if (output_.empty()) {
      std::cout << roformer::to_yaml(config) << std::flush;
    } else {
      roformer::save_config(config, output_);
      spdlog::info("wrote {}", output_);
    }
    spdlog::info("{}: valid; {} stage(s), {} steps; model {} layers x {} hidden, {} heads",
                 config.source, config.stages.size(), config.total_steps(),
                 config.model.num_hidden_layers, config.model.hidden_size,
                 config.model.num_attention_heads);
    return 0;
  }

 private:
  std::string for_command_;
  std::string output_;
};

}  // namespace

ROFORMER_REGISTER_COMMAND(ConfigCommand)
