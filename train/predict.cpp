#include "train/predict.h"

#include <algorithm>
#include <numeric>

#include "core/ops.h"
#include "data/tokenizer.h"
#include "layers/roformer.h"
#include "train/checkpoint.h"
#include "train/config.h"

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
    const data::TokenizerOptions options = tokenizer_options(impl_->config.data);
    const std::string vocab_path = vocab.empty() ? impl_->config.data.vocab : vocab;
    impl_->tokenizer = std::make_unique<data::Tokenizer>(vocab_path, options);
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

std::vector<MaskPrediction> FillMask::predict(const std::string& text, int64_t top_k) const {
  const data::Tokenizer& tok = *impl_->tokenizer;
  const int32_t mask_id = tok.vocab().find("[MASK]");
  const data::Encoding enc =
      tok.encode(text, std::nullopt, impl_->config.model.max_position_embeddings);
  std::vector<int64_t> rows;
  for (size_t i = 0; i < enc.input_ids.size(); ++i)
    if (enc.input_ids[i] == mask_id) rows.push_back(int64_t(i));
  if (rows.empty()) throw InputError("predict: the text has no [MASK] token: \"" + text + "\"");
  const int64_t S = int64_t(enc.input_ids.size());
  const Tensor ids = Tensor::from_vector<int32_t>(enc.input_ids, {1, S});
  const Tensor types = Tensor::from_vector<int32_t>(enc.token_type_ids, {1, S});
  const Tensor mask = Tensor::ones({1, S}, DType::i32);
  NoGradGuard no_grad;
  const Tensor probs = softmax(impl_->model->mlm_logits(
      ids, types, mask, Tensor::from_vector<int64_t>(rows, {int64_t(rows.size())})));
  const std::vector<float> p = probs.to_vector<float>();
  const int64_t V = probs.shape()[1];
  top_k = std::clamp<int64_t>(top_k, 1, V);
  std::vector<MaskPrediction> out;
  for (size_t r = 0; r < rows.size(); ++r) {
    std::vector<int32_t> order(static_cast<size_t>(V));
    std::iota(order.begin(), order.end(), 0);
    const float* row = p.data() + r * size_t(V);
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(),
                      [&](int32_t a, int32_t b) { return row[a] > row[b]; });
    MaskPrediction m;
    m.index = rows[r];
    for (int64_t k = 0; k < top_k; ++k)
      m.candidates.push_back(
          {tok.vocab().token(order[size_t(k)]), order[size_t(k)], double(row[order[size_t(k)]])});
    out.push_back(std::move(m));
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
