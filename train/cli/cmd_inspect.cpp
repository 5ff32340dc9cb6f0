// roformer inspect PATH: a checkpoint or a corpus shard, summarised.
#include <iostream>

#include "data/hdf5.h"
#include "data/shard.h"
#include "train/checkpoint.h"
#include "train/cli/command.h"

namespace {

class InspectCommand : public roformer::cli::Command {
 public:
  std::string name() const override { return "inspect"; }
  std::string description() const override {
    return "Summarise a checkpoint (step, stage, config, parameters) or a corpus shard";
  }
  roformer::cli::ConfigMode config_mode() const override {
    return roformer::cli::ConfigMode::kNone;
  }
  void setup(CLI::App& app) override {
    app.add_option("path", path_, "Checkpoint file, run directory or shard")->required();
  }
  int run(const roformer::cli::Invocation&) override {
    std::error_code ec;
    if (std::filesystem::is_directory(path_, ec)) {
      std::cout << roformer::describe_checkpoint(roformer::resolve_checkpoint(path_));
      return 0;
    }
    const roformer::hdf5::File file = roformer::hdf5::File::open(path_);
    const bool checkpoint = file.root().has_attr("format") &&
                            file.root().attr_string("format") == "roformer-checkpoint";
    std::cout << (checkpoint ? roformer::describe_checkpoint(path_)
                             : roformer::data::describe_shard(path_));
    return 0;
  }

 private:
  std::string path_;
};

}  // namespace

ROFORMER_REGISTER_COMMAND(InspectCommand)
