// roformer convert --from-hf DIR --out CKPT
// roformer convert --checkpoint CKPT --to-hf DIR
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "train/cli/command.h"
#include "train/hf_convert.h"
#include "train/preflight.h"

namespace {

class ConvertCommand : public roformer::cli::Command {
 public:
  std::string name() const override { return "convert"; }
  std::string description() const override {
    return "Hugging Face RoFormer folder (config.json, model.safetensors, vocab.txt) <-> "
           "checkpoint";
  }
  roformer::cli::ConfigMode config_mode() const override {
    return roformer::cli::ConfigMode::kNone;
  }
  void setup(CLI::App& app) override {
    auto* from = app.add_option("--from-hf", from_hf_, "Hugging Face RoFormer folder to read");
    auto* out = app.add_option("--out", out_, "Checkpoint file to write (with --from-hf)");
    auto* ckpt = app.add_option("--checkpoint", checkpoint_, "Checkpoint file or run directory");
    auto* to = app.add_option("--to-hf", to_hf_, "Folder to write (with --checkpoint)");
    from->needs(out)->excludes(ckpt)->excludes(to);
    out->needs(from);
    ckpt->needs(to);
    to->needs(ckpt);
  }
  int run(const roformer::cli::Invocation&) override {
    if (!from_hf_.empty()) {
      roformer::preflight_convert_from_hf(from_hf_);
      roformer::convert_from_hf(from_hf_, out_);
      spdlog::info("wrote {} from {}", out_, from_hf_);
    } else if (!checkpoint_.empty()) {
      roformer::convert_to_hf(checkpoint_, to_hf_);
      spdlog::info("wrote {} (config.json, model.safetensors, vocab.txt) from {}", to_hf_,
                   checkpoint_);
    } else {
      throw roformer::InputError(
          "convert: give --from-hf DIR --out CKPT or --checkpoint CKPT --to-hf DIR");
    }
    return 0;
  }

 private:
  std::string from_hf_, out_, checkpoint_, to_hf_;
};

}  // namespace

ROFORMER_REGISTER_COMMAND(ConvertCommand)
