// roformer convert --from-hf DIR --out CKPT [--device D]
// roformer convert --checkpoint CKPT --to-hf DIR [--device D]
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "train/cli/command.h"
#include "train/convert_check.h"
#include "train/hf_convert.h"
#include "train/preflight.h"
#include "train/run_device.h"

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
    app.add_option("--device", device_,
                   "Where the written model is loaded back and checked against its source "
                   "(cpu, cuda or cuda:N)");
    from->needs(out)->excludes(ckpt)->excludes(to);
    out->needs(from);
    ckpt->needs(to);
    to->needs(ckpt);
  }
  int run(const roformer::cli::Invocation&) override {
    const roformer::Device device = roformer::device_option(device_, "--device");
    roformer::ConversionCheck check;
    if (!from_hf_.empty()) {
      roformer::preflight_convert_from_hf(from_hf_);
      roformer::convert_from_hf(from_hf_, out_);
      spdlog::info("wrote {} from {}", out_, from_hf_);
      check = roformer::check_conversion(roformer::model_of_hf_folder(from_hf_, true),
                                         roformer::model_of_checkpoint(out_), device);
    } else if (!checkpoint_.empty()) {
      roformer::convert_to_hf(checkpoint_, to_hf_);
      spdlog::info("wrote {} (config.json, model.safetensors, vocab.txt) from {}", to_hf_,
                   checkpoint_);
      const roformer::ConvertedModel source = roformer::model_of_checkpoint(checkpoint_);
      check = roformer::check_conversion(
          source, roformer::model_of_hf_folder(to_hf_, roformer::has_mlm_head(source.parameters)),
          device);
    } else {
      throw roformer::InputError(
          "convert: give --from-hf DIR --out CKPT or --checkpoint CKPT --to-hf DIR");
    }
    spdlog::info(
        "checked on {}: the written model reproduces its source (hidden states {:.1e}{}{})",
        device.str(), check.hidden_rel_diff,
        check.logits_rel_diff >= 0 ? fmt::format(", MLM logits {:.1e}", check.logits_rel_diff)
                                   : std::string(),
        check.classifier_tensors > 0
            ? fmt::format(", {} classifier tensors bit for bit", check.classifier_tensors)
            : std::string());
    return 0;
  }

 private:
  std::string from_hf_, out_, checkpoint_, to_hf_, device_ = "cpu";
};

}  // namespace

ROFORMER_REGISTER_COMMAND(ConvertCommand)
