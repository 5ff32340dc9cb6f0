// Fill-mask prediction with a pretrained checkpoint: the top-k tokens and
// their probabilities at every [MASK] of a text.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "train/config.h"

namespace roformer {

struct MaskPrediction {
  int64_t index = 0;  // position of the [MASK] in the encoded sequence ([CLS] is 0)
  struct Candidate {
    std::string token;
    int32_t id = 0;
    double probability = 0;
  };
  std::vector<Candidate> candidates;
};

class FillMask {
 public:
  // Loads the model and, through the checkpoint's config, its vocabulary
  // (`vocab` overrides the path recorded there).
  explicit FillMask(const std::filesystem::path& checkpoint, const std::string& vocab = "");
  ~FillMask();
  FillMask(const FillMask&) = delete;
  FillMask& operator=(const FillMask&) = delete;

  // Throws InputError when the text has no [MASK].
  std::vector<MaskPrediction> predict(const std::string& text, int64_t top_k) const;
  // The checkpoint's config (its run.precision is the one predict runs in).
  const Config& config() const;

 private:
  struct Impl;
  Impl* impl_;
};

// {"text": ..., "masks": [{"index": i, "predictions": [{"token", "id", "probability"}]}]}
nlohmann::json fill_mask_json(const std::string& text, const std::vector<MaskPrediction>& masks);

}  // namespace roformer
