// roformer plot RUN_DIR [RUN_DIR...] --out FILE.svg|png: loss, MLM accuracy
// and learning rate against tokens seen, stage boundaries marked.
#include <spdlog/spdlog.h>

#include "train/cli/command.h"
#include "train/plot.h"

namespace {

class PlotCommand : public roformer::cli::Command {
 public:
  std::string name() const override { return "plot"; }
  std::string description() const override {
    return "Plot loss, accuracy and learning rate of run directories against tokens (gnuplot)";
  }
  roformer::cli::ConfigMode config_mode() const override {
    return roformer::cli::ConfigMode::kNone;
  }
  void setup(CLI::App& app) override {
    app.add_option("runs", runs_, "Run directories (each holds metrics.jsonl)")->required();
    app.add_option("-o,--out", out_, "Output file: .svg or .png")->required();
  }
  int run(const roformer::cli::Invocation&) override {
    std::vector<std::filesystem::path> dirs(runs_.begin(), runs_.end());
    roformer::plot_runs(dirs, out_);
    spdlog::info("wrote {}", out_);
    return 0;
  }

 private:
  std::vector<std::string> runs_;
  std::string out_;
};

}  // namespace

ROFORMER_REGISTER_COMMAND(PlotCommand)
