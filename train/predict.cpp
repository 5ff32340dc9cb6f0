#include "train/predict.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <numeric>

#include "core/ops.h"
#include "data/tokenizer.h"
#include "layers/roformer.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/memory_estimate.h"
#include "train/vocab_check.h"

namespace roformer {

struct FillMask::Impl {
  Config config;
  std::unique_ptr<data::Tokenizer> tokenizer;
  std::unique_ptr<RoFormerForMaskedLM> model;
};

FillMask::FillMask(const std::filesystem::path& checkpoint, const std::string& vocab)
    : impl_(new Impl) {
  try {
    const std::filesystem::path path = resolve_checkpoint(checkpoint);
    CheckpointData data = load_checkpoint(path, false);
    impl_->config = parse_config_string(data.config_yaml, path.string());
    check_memory_for_model(impl_->config.model, MemoryUse::kInference, path.string(), "model.");
    const data::TokenizerOptions options = tokenizer_options(impl_->config.data);
    const std::string vocab_path = vocab.empty() ? impl_->config.data.vocab : vocab;
    impl_->tokenizer = std::make_unique<data::Tokenizer>(vocab_path, options);
    check_vocab_fits_model(impl_->tokenizer->vocab().size(), impl_->config.model.vocab_size,
                           vocab_path, "model.vocab_size", VocabExcess::kWarn);
    impl_->model = std::make_unique<RoFormerForMaskedLM>(impl_->config.model, 0);
    impl_->model->load_state_dict(data.parameters);
    impl_->model->eval();
  } catch (...) {
    delete impl_;
    throw;
  }
}

FillMask::~FillMask() {
  delete impl_;
}

const Config& FillMask::config() const {
  return impl_->config;
}

std::vector<MaskPrediction> FillMask::predict(const std::string& text, int64_t top_k) const {
  const data::Tokenizer& tok = *impl_->tokenizer;
  const data::Vocab& vocab = tok.vocab();
  const int32_t mask_id = vocab.find("[MASK]");
  const std::vector<int32_t> ids = tok.encode_ids(text);  // without [CLS] and [SEP]
  std::vector<int64_t> masks;                             // positions in ids
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] == mask_id) masks.push_back(int64_t(i));
  if (masks.empty()) throw InputError("predict: the text has no [MASK] token: \"" + text + "\"");

  // A text longer than the model's positions is not cut off: each mask is
  // predicted within a window of the longest sequence around it.
  const int64_t n = int64_t(ids.size());
  const int64_t window = std::max<int64_t>(1, impl_->config.model.max_position_embeddings - 2);
  if (n > window)
    spdlog::warn(
        "predict: the text has {} tokens, more than the {} the model takes at once "
        "(model.max_position_embeddings {}); each [MASK] is predicted within a window of {} "
        "tokens around it",
        n, window, impl_->config.model.max_position_embeddings, window);

  // Padding rows of the embedding (model.vocab_size beyond the vocab file)
  // have no token: never proposed.
  const int64_t tokens = vocab.size();
  top_k = std::clamp<int64_t>(top_k, 1, tokens);
  std::vector<MaskPrediction> out;
  NoGradGuard no_grad;
  for (size_t next = 0; next < masks.size();) {
    const int64_t start =
        std::clamp<int64_t>(masks[next] - window / 2, 0, std::max<int64_t>(0, n - window));
    const int64_t stop = std::min(n, start + window);
    std::vector<int32_t> input = {vocab.special().cls};
    input.insert(input.end(), ids.begin() + start, ids.begin() + stop);
    input.push_back(vocab.special().sep);
    std::vector<int64_t> rows;
    size_t last = next;
    for (; last < masks.size() && masks[last] < stop; ++last)
      rows.push_back(masks[last] - start + 1);
    const int64_t S = int64_t(input.size());
    const Tensor input_ids = Tensor::from_vector<int32_t>(input, {1, S});
    const Tensor types = Tensor::zeros({1, S}, DType::i32);
    const Tensor attention = Tensor::ones({1, S}, DType::i32);
    const Tensor probs = softmax(impl_->model->mlm_logits(
        input_ids, types, attention, Tensor::from_vector<int64_t>(rows, {int64_t(rows.size())})));
    const std::vector<float> p = probs.to_vector<float>();
    const int64_t V = probs.shape()[1];
    for (size_t r = 0; r < rows.size(); ++r) {
      std::vector<int32_t> order(static_cast<size_t>(std::min(V, tokens)));
      std::iota(order.begin(), order.end(), 0);
      const float* row = p.data() + r * size_t(V);
      std::partial_sort(order.begin(), order.begin() + top_k, order.end(),
                        [&](int32_t a, int32_t b) { return row[a] > row[b]; });
      MaskPrediction m;
      m.index = masks[next + r] + 1;  // in the whole text's sequence, [CLS] at 0
      for (int64_t k = 0; k < top_k; ++k)
        m.candidates.push_back(
            {vocab.token(order[size_t(k)]), order[size_t(k)], double(row[order[size_t(k)]])});
      out.push_back(std::move(m));
    }
    next = last;
  }
  return out;
}

nlohmann::json fill_mask_json(const std::string& text, const std::vector<MaskPrediction>& masks) {
  nlohmann::json j = {{"text", text}, {"masks", nlohmann::json::array()}};
  for (const MaskPrediction& m : masks) {
    nlohmann::json preds = nlohmann::json::array();
    for (const auto& c : m.candidates)
      preds.push_back({{"token", c.token}, {"id", c.id}, {"probability", c.probability}});
    j["masks"].push_back({{"index", m.index}, {"predictions", preds}});
  }
  return j;
}

}  // namespace roformer
