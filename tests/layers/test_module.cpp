// Module: hierarchical names, state_dict / load_state_dict (one error listing
// every problem), train/eval, initialisation, flat parameters, devices.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "layers/roformer.h"
#include "tests/core/gradcheck.h"
#include "tests/test_support.h"

namespace roformer {
namespace {

ModelConfig tiny_config() {
  ModelConfig c;
  c.vocab_size = 50;
  c.hidden_size = 16;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.intermediate_size = 24;
  c.max_position_embeddings = 32;
  return c;
}

std::vector<std::string> names_of(const std::vector<NamedTensor>& entries) {
  std::vector<std::string> out;
  for (const auto& e : entries) out.push_back(e.name);
  return out;
}

TEST(Module, ParameterNamesAreHuggingFaces) {
  const RoFormerForMaskedLM model(tiny_config(), 1);
  const std::string L = "roformer.encoder.layer.0.";
  const std::vector<std::string> expected{
      "roformer.embeddings.word_embeddings.weight",
      "roformer.embeddings.token_type_embeddings.weight",
      "roformer.embeddings.LayerNorm.weight",
      "roformer.embeddings.LayerNorm.bias",
      L + "attention.self.query.weight",
      L + "attention.self.query.bias",
      L + "attention.self.key.weight",
      L + "attention.self.key.bias",
      L + "attention.self.value.weight",
      L + "attention.self.value.bias",
      L + "attention.output.dense.weight",
      L + "attention.output.dense.bias",
      L + "attention.output.LayerNorm.weight",
      L + "attention.output.LayerNorm.bias",
      L + "intermediate.dense.weight",
      L + "intermediate.dense.bias",
      L + "output.dense.weight",
      L + "output.dense.bias",
      L + "output.LayerNorm.weight",
      L + "output.LayerNorm.bias",
      "cls.predictions.bias",
      "cls.predictions.transform.dense.weight",
      "cls.predictions.transform.dense.bias",
      "cls.predictions.transform.LayerNorm.weight",
      "cls.predictions.transform.LayerNorm.bias",
  };
  EXPECT_EQ(names_of(model.named_parameters()), expected);
  // Linear weights are [out, in]; the decoder is the word embedding (no own entry).
  EXPECT_EQ(model.find(L + "intermediate.dense.weight").shape(), (Shape{24, 16}));
  EXPECT_EQ(model.find("roformer.embeddings.word_embeddings.weight").shape(), (Shape{50, 16}));
  int64_t total = 0;
  for (const auto& p : model.parameters()) {
    EXPECT_TRUE(p.requires_grad());
    total += p.numel();
  }
  EXPECT_EQ(model.num_parameters(), total);
  EXPECT_THROW(model.find("cls.predictions.decoder.weight"), Error);
}

TEST(Module, OptionalParametersFollowTheConfig) {
  ModelConfig c = tiny_config();
  c.position = PositionEncoding::kAbsolute;
  c.embedding_size = 8;
  const RoFormerForMaskedLM model(c, 1);
  EXPECT_EQ(model.find("roformer.embeddings.position_embeddings.weight").shape(), (Shape{32, 8}));
  EXPECT_EQ(model.find("roformer.embeddings.word_embeddings.weight").shape(), (Shape{50, 8}));
  EXPECT_EQ(model.find("roformer.embeddings_project.weight").shape(), (Shape{16, 8}));
  EXPECT_EQ(model.find("cls.predictions.transform.dense.weight").shape(), (Shape{8, 16}));
  EXPECT_EQ(model.find("cls.predictions.transform.LayerNorm.weight").shape(), (Shape{8}));
  const RoFormerForSequenceClassification cls(tiny_config(), 3, 1);
  EXPECT_EQ(cls.find("classifier.dense.weight").shape(), (Shape{16, 16}));
  EXPECT_EQ(cls.find("classifier.out_proj.weight").shape(), (Shape{3, 16}));
  EXPECT_EQ(cls.find("classifier.out_proj.bias").shape(), (Shape{3}));
  EXPECT_THROW(cls.find("cls.predictions.bias"), Error);
}

TEST(Module, StateDictRoundTripCopiesValues) {
  RoFormerForMaskedLM a(tiny_config(), 1), b(tiny_config(), 2);
  const Tensor wa = a.find("cls.predictions.transform.dense.weight");
  const Tensor wb = b.find("cls.predictions.transform.dense.weight");
  EXPECT_NE(wa.to_vector<float>(), wb.to_vector<float>());
  b.load_state_dict(a.state_dict());
  for (const auto& e : a.state_dict())
    EXPECT_EQ(e.tensor.to_vector<float>(), b.find(e.name).to_vector<float>()) << e.name;
  // In place: handles held before the load see the new values; still leaves.
  EXPECT_EQ(wb.to_vector<float>(), wa.to_vector<float>());
  EXPECT_TRUE(wb.is_leaf() && wb.requires_grad());
  EXPECT_FALSE(wb.shares_storage_with(wa));
  // Other floating dtypes are converted.
  StateDict f64 = a.state_dict();
  for (auto& e : f64) e.tensor = e.tensor.to(DType::f64).detach();
  EXPECT_NO_THROW(b.load_state_dict(f64));
}

TEST(Module, LoadStateDictReportsEveryProblemAtOnce) {
  RoFormerForMaskedLM model(tiny_config(), 1);
  StateDict state = model.state_dict();
  const Tensor before = model.find("roformer.embeddings.LayerNorm.bias").clone();
  // One missing, one unexpected, two mis-shaped.
  state.erase(state.begin() + 2);  // roformer.embeddings.LayerNorm.weight
  state.push_back({"cls.predictions.decoder.weight", Tensor::zeros({50, 16})});
  for (auto& e : state) {
    if (e.name == "roformer.embeddings.LayerNorm.bias") e.tensor = Tensor::ones({17});
    if (e.name == "cls.predictions.bias") e.tensor = Tensor::ones({51});
  }
  try {
    model.load_state_dict(state);
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    for (const char* part :
         {"1 missing", "roformer.embeddings.LayerNorm.weight", "1 unexpected",
          "cls.predictions.decoder.weight", "2 mismatched", "roformer.embeddings.LayerNorm.bias",
          "[17]", "[16]", "cls.predictions.bias", "[51]", "[50]"})
      EXPECT_NE(msg.find(part), std::string::npos) << "missing '" << part << "' in:\n" << msg;
  }
  // Nothing was copied.
  EXPECT_EQ(model.find("roformer.embeddings.LayerNorm.bias").to_vector<float>(),
            before.to_vector<float>());
  // Non-strict tolerates missing/unexpected names but never wrong shapes.
  StateDict partial{{"cls.predictions.bias", Tensor::ones({50})},
                    {"something.else", Tensor::ones({3})}};
  model.load_state_dict(partial, /*strict=*/false);
  EXPECT_EQ(model.find("cls.predictions.bias").to_vector<float>(), std::vector<float>(50, 1.0f));
  partial[0].tensor = Tensor::ones({49});
  EXPECT_THROW(model.load_state_dict(partial, false), InputError);
}

TEST(Module, TrainEvalReachesEveryModule) {
  RoFormerForMaskedLM model(tiny_config(), 1);
  EXPECT_TRUE(model.is_training());
  model.eval();
  EXPECT_FALSE(model.is_training());
  EXPECT_FALSE(model.roformer().layer(0).self_attention().query().is_training());
  model.train();
  EXPECT_TRUE(model.roformer().layer(0).self_attention().query().is_training());
}

TEST(Module, InitialisationIsBertsAndDeterministic) {
  ModelConfig c = tiny_config();
  c.vocab_size = 2000;
  const RoFormerForMaskedLM a(c, 7), b(c, 7), other(c, 8);
  for (const auto& e : a.state_dict())
    EXPECT_EQ(e.tensor.to_vector<float>(), b.find(e.name).to_vector<float>()) << e.name;
  const auto w = a.find("roformer.embeddings.word_embeddings.weight").to_vector<double>();
  EXPECT_NE(w, other.find("roformer.embeddings.word_embeddings.weight").to_vector<double>());
  double sum = 0, sq = 0;
  for (double x : w) {
    sum += x;
    sq += x * x;
  }
  const double n = double(w.size()), mean = sum / n;
  EXPECT_NEAR(mean, 0.0, 0.002);
  EXPECT_NEAR(std::sqrt(sq / n - mean * mean), 0.02, 0.001);
  // The padding row (pad_token_id = 0) starts at zero, as nn.Embedding(padding_idx).
  for (int64_t i = 0; i < c.hidden_size; ++i) EXPECT_EQ(w[size_t(i)], 0.0);
  for (const auto& e : a.named_parameters()) {
    const auto v = e.tensor.to_vector<double>();
    const bool ln = e.name.find("LayerNorm") != std::string::npos;
    if (e.name.ends_with("bias")) {
      EXPECT_EQ(v, std::vector<double>(v.size(), 0.0)) << e.name;
    } else if (ln) {
      EXPECT_EQ(v, std::vector<double>(v.size(), 1.0)) << e.name;
    }
  }
}

TEST(Module, RejectsInvalidConfigsWithTheKey) {
  ModelConfig c = tiny_config();
  c.num_attention_heads = 3;  // 16 is not divisible by 3
  try {
    RoFormerForMaskedLM model(c, 1);
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("num_attention_heads"), std::string::npos) << e.what();
  }
}

// A two-module tree that is not flattened by its constructor.
class TwoLayers : public Module {
 public:
  TwoLayers() : dense_(4, 3, true, 0.5), norm_(3, 1e-12) {
    register_module("dense", dense_);
    register_module("norm", norm_);
    Generator gen{5, 0};
    reset_parameters(gen);
  }
  Tensor forward(const Tensor& x) const { return norm_.forward(dense_.forward(x)); }

 private:
  Linear dense_;
  LayerNorm norm_;
};

TEST(Module, FlattenKeepsNamesOrderValuesAndHandles) {
  TwoLayers tree;
  const StateDict before = tree.state_dict();
  std::vector<std::vector<float>> values;
  for (const auto& e : before) values.push_back(e.tensor.to_vector<float>());
  FlatParameters& flat = tree.flatten_parameters();
  EXPECT_EQ(&tree.flatten_parameters(), &flat);  // once
  const StateDict after = tree.state_dict();
  ASSERT_EQ(names_of(after), names_of(before));
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].tensor.impl_ptr(), before[i].tensor.impl_ptr()) << after[i].name;
    EXPECT_EQ(after[i].tensor.to_vector<float>(), values[i]) << after[i].name;
    EXPECT_TRUE(after[i].tensor.shares_storage_with(flat.data())) << after[i].name;
  }
  EXPECT_EQ(FlatParameters::of(tree.parameters()).get(), &flat);
}

TEST(Module, ModelsAreFlatWithTheTiedEmbeddingAsOneParameter) {
  RoFormerForMaskedLM mlm(tiny_config(), 1);
  ASSERT_TRUE(mlm.flat_parameters());
  EXPECT_EQ(FlatParameters::of(mlm.parameters()), mlm.flat_parameters());
  EXPECT_EQ(mlm.flat_parameters()->num_elements(), mlm.num_parameters());
  RoFormerForSequenceClassification cls(tiny_config(), 3, 1);
  EXPECT_EQ(FlatParameters::of(cls.parameters()), cls.flat_parameters());
  // load_state_dict writes into the views: still flat, new values.
  RoFormerForMaskedLM other(tiny_config(), 2);
  other.load_state_dict(mlm.state_dict());
  for (const auto& e : other.named_parameters()) {
    EXPECT_TRUE(e.tensor.shares_storage_with(other.flat_parameters()->data())) << e.name;
    EXPECT_EQ(e.tensor.to_vector<float>(), mlm.find(e.name).to_vector<float>()) << e.name;
  }
}

// Masked-LM loss of `model` on a fixed batch with a few labelled positions.
Tensor mlm_loss(const RoFormerForMaskedLM& model, uint64_t seed) {
  const int64_t B = 2, S = 6;
  Generator g{seed, 0};
  const auto u = Tensor::rand({B * S}, g, DType::f64).to_vector<double>();
  std::vector<int32_t> ids, labels(size_t(B * S), -100);
  for (double x : u) ids.push_back(int32_t(1 + x * 48));
  for (size_t i : {1u, 4u, 8u}) labels[i] = ids[(i + 3) % ids.size()];
  DropoutContext dropout{1, 0};
  return model
      .forward_mlm(Tensor::from_vector(ids, {B, S}), Tensor(), Tensor(),
                   Tensor::from_vector(labels, {B, S}), /*training=*/false, dropout)
      .loss;
}

TEST(Module, ReadyHooksFireOncePerParameterAfterAllContributions) {
  ModelConfig c = tiny_config();
  c.num_hidden_layers = 2;
  RoFormerForMaskedLM model(c, 3);
  const auto named = model.named_parameters();
  const FlatParameters& flat = *model.flat_parameters();
  std::vector<size_t> order;
  std::vector<std::vector<float>> at_hook(named.size());
  model.flat_parameters()->set_grad_ready_hook([&](size_t i) {
    order.push_back(i);
    at_hook[i] = flat.parameters()[i].grad().to_vector<float>();
  });
  auto position = [&](const std::string& name) {
    for (size_t k = 0; k < order.size(); ++k)
      if (named[order[k]].name == name) return k;
    ADD_FAILURE() << name << " never became ready";
    return order.size();
  };
  for (int micro_batch = 0; micro_batch < 2; ++micro_batch) {
    order.clear();
    mlm_loss(model, 10 + uint64_t(micro_batch)).backward();
    // Every parameter once, with its complete gradient at that moment: the
    // tied word embedding only after both the decoder and the gather.
    ASSERT_EQ(order.size(), named.size());
    for (size_t i = 0; i < named.size(); ++i)
      EXPECT_EQ(at_hook[i], named[i].tensor.grad().to_vector<float>()) << named[i].name;
    // Graph order: the head first, then the top layer, ..., the embeddings.
    const std::string L0 = "roformer.encoder.layer.0.", L1 = "roformer.encoder.layer.1.";
    EXPECT_LT(position("cls.predictions.bias"), position(L1 + "output.dense.weight"));
    EXPECT_LT(position(L1 + "output.dense.weight"), position(L1 + "attention.self.query.weight"));
    EXPECT_LT(position(L1 + "attention.self.query.weight"), position(L0 + "output.dense.weight"));
    EXPECT_LT(position(L0 + "attention.self.query.weight"),
              position("roformer.embeddings.LayerNorm.weight"));
    EXPECT_LT(position("roformer.embeddings.LayerNorm.weight"),
              position("roformer.embeddings.word_embeddings.weight"));
  }
  model.zero_grad();
  for (const auto& e : named) EXPECT_FALSE(e.tensor.grad().defined()) << e.name;
  const auto grads = flat.grad().to_vector<float>();
  EXPECT_TRUE(std::all_of(grads.begin(), grads.end(), [](float v) { return v == 0.0f; }));
}

TEST(Module, ToMovesTheModuleOrFailsWithTensorsError) {
  RoFormerForMaskedLM model(tiny_config(), 1);
  TwoLayers tree;  // not flat: moved tensor by tensor
  const auto before = model.find("cls.predictions.bias").to_vector<float>();
  model.to(Device::cpu());
  tree.to(Device::cpu());
  EXPECT_TRUE(
      model.find("cls.predictions.bias").shares_storage_with(model.flat_parameters()->data()));
  const std::string tensor_error =
      roformer::testing::error_of([] { (void)Tensor::zeros({1}).to(Device::cuda(0)); });
  if (tensor_error == "no error") {  // a build and machine with a GPU: a round trip
    model.to(Device::cuda(0));
    tree.to(Device::cuda(0));
    EXPECT_TRUE(model.find("cls.predictions.bias").device().is_cuda());
    EXPECT_TRUE(tree.find("dense.weight").device().is_cuda());
    model.to(Device::cpu());
    tree.to(Device::cpu());
  } else {
    EXPECT_EQ(roformer::testing::error_of([&] { model.to(Device::cuda(0)); }), tensor_error);
    EXPECT_EQ(roformer::testing::error_of([&] { tree.to(Device::cuda(0)); }), tensor_error);
  }
  EXPECT_TRUE(model.find("cls.predictions.bias").device().is_cpu());
  EXPECT_EQ(model.find("cls.predictions.bias").to_vector<float>(), before);
  EXPECT_TRUE(tree.find("dense.weight").device().is_cpu());
}

}  // namespace
}  // namespace roformer
