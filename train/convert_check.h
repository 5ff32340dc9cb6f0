// What `roformer convert --device D` checks once the files are written: the
// model read back from them, on D, against its source on the CPU. Both run a
// fixed probe batch (2 x 16 token ids spread over the vocabulary, no
// dropout): the encoder's last hidden states always, and the MLM logits when
// both sides have the MLM head. A fine-tuned checkpoint's classifier
// (`classifier.*`, no MLM head) is compared tensor by tensor, bit for bit.
// Each side is built from its own config, so a config written wrong (RoPE
// base, layer-norm eps, sizes) shows as well as a tensor.
#pragma once

#include <filesystem>
#include <string>

#include "core/device.h"
#include "layers/model_config.h"
#include "layers/module.h"

namespace roformer {

struct ConvertedModel {
  ModelConfig config;
  StateDict parameters;  // Hugging Face names
  std::string where;     // the file or folder, for messages
};

struct ConversionCheck {
  double hidden_rel_diff = 0;   // max |written - source| / max |source|
  double logits_rel_diff = -1;  // -1: no MLM head on one side
  int classifier_tensors = 0;   // compared bit for bit
};

// A checkpoint (file or run directory) and a Hugging Face folder as models
// (with the MLM head only when `mlm_head`; a folder's classifier.* tensors
// are kept).
ConvertedModel model_of_checkpoint(const std::filesystem::path& checkpoint);
ConvertedModel model_of_hf_folder(const std::filesystem::path& dir, bool mlm_head);

// Whether `parameters` hold the MLM head (cls.predictions.*).
bool has_mlm_head(const StateDict& parameters);

// Throws Error naming both sides and the difference when either is above
// `tolerance` (or a classifier tensor differs).
ConversionCheck check_conversion(const ConvertedModel& source, const ConvertedModel& written,
                                 Device device, double tolerance = 1e-4);

}  // namespace roformer
