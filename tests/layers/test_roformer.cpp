// The whole model against the golden fixtures (a PyTorch reference of
// Hugging Face's RoFormer), and the paper's properties on the whole model.
#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <numeric>
#include <optional>

#include "core/allocator.h"
#include "core/precision.h"
#include "core/profile.h"
#include "layers/roformer.h"
#include "tests/core/gradcheck.h"
#include "tests/layers/golden_h5.h"

namespace roformer {
namespace {

using testing::golden_config;

using testing::all_close;
using testing::GoldenFile;
using testing::max_rel_error;

StateDict golden_weights(const GoldenFile& f) {
  StateDict state;
  for (const auto& name : f.members("weights"))
    state.push_back({name, f.read("weights/" + name).to(DType::f32)});
  return state;
}

std::string fixture(const char* name) {
  return testing::golden_path(name);
}

TEST(RoFormerGolden, MaskedLMMatchesReference) {
  const GoldenFile f(fixture("golden_roformer_mlm.h5"));
  testing::expect_golden_origin(f, "RoFormerForMaskedLM");
  RoFormerForMaskedLM model(golden_config(), 1);
  model.load_state_dict(golden_weights(f));  // strict: the names are Hugging Face's
  const Tensor ids = f.read("input_ids", DType::i32), types = f.read("token_type_ids", DType::i32);
  const Tensor mask = f.read("attention_mask", DType::i32), labels = f.read("labels", DType::i32);
  const Tensor ref_logits = f.read("logits");
  const int64_t B = ids.size(0), S = ids.size(1), V = 1000;

  // Every position, padding included, as Hugging Face computes them.
  const Tensor logits = model.mlm_logits(ids, types, mask).view({B, S, V});
  const double logits_err = max_rel_error(logits, ref_logits);
  EXPECT_LT(logits_err, 1e-5);

  DropoutContext gen{1, 0};
  const MlmOutput out = model.forward_mlm(ids, types, mask, labels, /*training=*/true, gen);
  const double ref_loss = f.read("loss").item();
  EXPECT_NEAR(out.loss.item(), ref_loss, 1e-6 * std::abs(ref_loss));
  int64_t labelled = 0;
  for (int64_t l : labels.to_vector<int64_t>()) labelled += l != -100;
  EXPECT_EQ(out.num_masked, labelled);

  out.loss.backward();
  const auto grads = f.members("grads");
  ASSERT_EQ(grads.size(), model.named_parameters().size());
  double worst = 0;
  std::string worst_name;
  for (const auto& p : model.named_parameters()) {
    ASSERT_TRUE(p.tensor.grad().defined()) << p.name;
    const double err = max_rel_error(p.tensor.grad(), f.read("grads/" + p.name));
    EXPECT_LT(err, 1e-4) << p.name;
    if (err > worst) worst = err, worst_name = p.name;
  }
  std::printf(
      "golden MLM: logits rel err %.2e, loss %.10f vs %.10f, worst grad rel err %.2e (%s)\n",
      logits_err, out.loss.item(), ref_loss, worst, worst_name.c_str());
}

TEST(RoFormerGolden, SequenceClassificationMatchesReference) {
  const GoldenFile f(fixture("golden_roformer_cls.h5"));
  testing::expect_golden_origin(f, "RoFormerForSequenceClassification");
  RoFormerForSequenceClassification model(golden_config(), 3, 1);
  model.load_state_dict(golden_weights(f));
  const Tensor ids = f.read("input_ids", DType::i32), types = f.read("token_type_ids", DType::i32);
  const Tensor mask = f.read("attention_mask", DType::i32), labels = f.read("labels", DType::i32);
  DropoutContext gen{1, 0};
  const ClassificationOutput out = model.forward(ids, types, mask, labels, true, gen);
  EXPECT_LT(max_rel_error(out.logits, f.read("logits")), 1e-5);
  const double ref_loss = f.read("loss").item();
  EXPECT_NEAR(out.loss.item(), ref_loss, 1e-6 * std::abs(ref_loss));
  out.loss.backward();
  ASSERT_EQ(f.members("grads").size(), model.named_parameters().size());
  for (const auto& p : model.named_parameters()) {
    ASSERT_TRUE(p.tensor.grad().defined()) << p.name;
    EXPECT_LT(max_rel_error(p.tensor.grad(), f.read("grads/" + p.name)), 1e-4) << p.name;
  }
}

// --- the paper's properties on the whole model ----------------------------------------

ModelConfig small_config() {
  ModelConfig c;
  c.vocab_size = 97;
  c.hidden_size = 32;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.intermediate_size = 48;
  c.max_position_embeddings = 128;
  c.hidden_dropout_prob = 0.0;
  c.attention_probs_dropout_prob = 0.0;
  return c;
}

Tensor random_ids(int64_t B, int64_t S, int64_t vocab, uint64_t seed, int64_t low = 1) {
  Generator gen{seed, 0};
  const auto u = Tensor::rand({B, S}, gen, DType::f64).to_vector<double>();
  std::vector<int32_t> ids;
  for (double x : u) ids.push_back(int32_t(low + int64_t(x * double(vocab - low))));
  return Tensor::from_vector(ids, {B, S});
}

// Hidden states of `tokens` [1, n] placed after `shift` padding tokens that
// no one attends to: the same tokens at positions shift .. shift + n - 1.
Tensor hidden_at_offset(const RoFormerModel& model, const Tensor& tokens, int64_t shift) {
  const int64_t n = tokens.size(1);
  std::vector<int32_t> ids(size_t(shift), 0), mask(size_t(shift), 0);
  for (int32_t t : tokens.to_vector<int32_t>()) {
    ids.push_back(t);
    mask.push_back(1);
  }
  const int64_t S = shift + n;
  NoGradGuard no_grad;
  DropoutContext gen{0, 0};
  const Tensor h = model.forward(Tensor::from_vector(ids, {1, S}), Tensor(),
                                 Tensor::from_vector(mask, {1, S}), false, gen);
  return h.narrow(1, shift, n).contiguous();
}

TEST(RoFormerProperties, ShiftingAllPositionsLeavesTheModelUnchanged) {
  // Attention scores depend only on m - n, so moving every token by the same
  // offset changes nothing; an absolute position table is the control.
  const Tensor tokens = random_ids(1, 12, 97, 3);
  for (const auto layout : {RopeLayout::interleaved, RopeLayout::half}) {
    ModelConfig c = small_config();
    c.rope_layout = layout;
    const RoFormerForMaskedLM model(c, 11);
    const Tensor base = hidden_at_offset(model.roformer(), tokens, 0);
    for (int64_t shift : {1, 17, 100})
      EXPECT_TRUE(all_close(hidden_at_offset(model.roformer(), tokens, shift), base, 2e-4, 2e-5))
          << "shift " << shift;
  }
  ModelConfig c = small_config();
  c.position = PositionEncoding::kAbsolute;
  const RoFormerForMaskedLM absolute(c, 11);
  EXPECT_GT(max_rel_error(hidden_at_offset(absolute.roformer(), tokens, 17),
                          hidden_at_offset(absolute.roformer(), tokens, 0)),
            1e-2);
}

TEST(RoFormerProperties, RotatedScoresDependOnlyOnRelativePosition) {
  // q_m . k_n through the rope op: equal for equal m - n (paper eq. 16).
  Generator gen{5, 0};
  const Tensor q = Tensor::randn({1, 1, 1, 64}, gen, DType::f64).expand({1, 1, 40, 64});
  const Tensor k = Tensor::randn({1, 1, 1, 64}, gen, DType::f64).expand({1, 1, 40, 64});
  const Tensor pos = Tensor::arange(0, 40);
  const Tensor scores = matmul(rope(q, pos), rope(k, pos).transpose(-1, -2)).view({40, 40});
  const auto s = scores.to_vector<double>();
  for (int64_t m = 0; m + 5 < 40; ++m)
    for (int64_t n = 0; n + 5 < 40; ++n)
      EXPECT_NEAR(s[size_t(m * 40 + n)], s[size_t((m + 5) * 40 + n + 5)], 1e-10);
}

// (1 / (d/2)) sum_j |S_j| with S_j = sum_{k<j} e^{i r theta_k}, the relative
// upper bound of Appendix C, for relative distances r = 0..max_r. The
// rotations e^{i r theta_k} come from the rope op applied to unit pairs.
std::vector<double> decay_curve(int64_t d, int64_t max_r, double base) {
  std::vector<double> unit(size_t(d), 0.0);
  for (int64_t k = 0; k < d; k += 2) unit[size_t(k)] = 1.0;
  const Tensor x = Tensor::from_vector(unit, {1, d}).expand({max_r + 1, d});
  const auto rot = rope(x, Tensor::arange(0, max_r + 1), base).to_vector<double>();
  std::vector<double> curve;
  for (int64_t r = 0; r <= max_r; ++r) {
    std::complex<double> partial = 0;
    double total = 0;
    for (int64_t k = 0; k < d / 2; ++k) {
      partial += std::complex<double>(rot[size_t(r * d + 2 * k)], rot[size_t(r * d + 2 * k + 1)]);
      total += std::abs(partial);
    }
    curve.push_back(total / double(d / 2));
  }
  return curve;
}

TEST(RoFormerProperties, LongTermDecayOfAppendixC) {
  const std::vector<double> curve = decay_curve(128, 256, 10000.0);
  auto window_mean = [&](int64_t lo, int64_t hi) {
    return std::accumulate(curve.begin() + lo, curve.begin() + hi + 1, 0.0) / double(hi - lo + 1);
  };
  EXPECT_NEAR(curve[0], (64.0 + 1.0) / 2.0, 1e-9);  // r = 0: |S_j| = j
  const double near = window_mean(1, 10), mid = window_mean(50, 100), far = window_mean(200, 256);
  EXPECT_GT(near, mid);
  EXPECT_GT(mid, far);
  EXPECT_GT(near, 2.0 * far);
}

// --- options ------------------------------------------------------------------------

MlmOutput mlm_step(const RoFormerForMaskedLM& model, uint64_t seed, bool training = true) {
  const int64_t B = 3, S = 16;
  const Tensor ids = random_ids(B, S, model.config().vocab_size, seed);
  std::vector<int32_t> mask(size_t(B * S), 1), labels(size_t(B * S), -100);
  for (int64_t s = 10; s < S; ++s) mask[size_t(2 * S + s)] = 0;
  for (int64_t i = 0; i < B * S; i += 5)
    if (mask[size_t(i)]) labels[size_t(i)] = int32_t((i * 7) % model.config().vocab_size);
  DropoutContext gen{seed + 100, 0};
  return model.forward_mlm(ids, Tensor(), Tensor::from_vector(mask, {B, S}),
                           Tensor::from_vector(labels, {B, S}), training, gen);
}

TEST(RoFormerOptions, EveryVariantTrains) {
  struct Variant {
    const char* name;
    void (*apply)(ModelConfig&);
  };
  const Variant variants[] = {
      {"rope", [](ModelConfig&) {}},
      {"absolute", [](ModelConfig& c) { c.position = PositionEncoding::kAbsolute; }},
      {"none", [](ModelConfig& c) { c.position = PositionEncoding::kNone; }},
      {"half", [](ModelConfig& c) { c.rope_layout = RopeLayout::kHalf; }},
      {"rotary_value", [](ModelConfig& c) { c.rotary_value = true; }},
      {"embedding_size", [](ModelConfig& c) { c.embedding_size = 16; }},
      {"gelu_new", [](ModelConfig& c) { c.hidden_act = "gelu_new"; }},
      {"linear", [](ModelConfig& c) { c.attention = AttentionKind::kLinear; }},
      {"linear+rotary_value",
       [](ModelConfig& c) {
         c.attention = AttentionKind::kLinear;
         c.rotary_value = true;
       }},
  };
  std::vector<double> losses;
  for (const auto& v : variants) {
    ModelConfig c = small_config();
    c.hidden_dropout_prob = 0.1;
    c.attention_probs_dropout_prob = 0.1;
    c.initializer_range = 0.3;  // peaked attention: position options matter
    v.apply(c);
    RoFormerForMaskedLM model(c, 5);
    const MlmOutput out = mlm_step(model, 1);
    ASSERT_TRUE(std::isfinite(out.loss.item())) << v.name;
    EXPECT_GT(out.num_masked, 0);
    out.loss.backward();
    for (const auto& p : model.named_parameters()) {
      ASSERT_TRUE(p.tensor.grad().defined()) << v.name << ": " << p.name;
      for (double g : p.tensor.grad().to_vector<double>()) ASSERT_TRUE(std::isfinite(g)) << p.name;
    }
    losses.push_back(out.loss.item());
  }
  // Each option changes the computation (same seed, same weights where shared).
  for (size_t i = 1; i < losses.size(); ++i) EXPECT_NE(losses[i], losses[0]) << variants[i].name;
}

TEST(RoFormerOptions, AttentionKernelChangesHowNotWhat) {
  // model.attention_kernel: RoPE inside the attention op or as separate ops
  // before it gives the same loss and gradients (padding mask and dropout on).
  auto run = [](AttentionKernel kernel, RopeLayout layout, double attention_dropout = 0.1) {
    ModelConfig c = small_config();
    c.hidden_dropout_prob = 0.1;
    c.attention_probs_dropout_prob = attention_dropout;
    c.rope_layout = layout;
    c.attention_kernel = kernel;
    RoFormerForMaskedLM model(c, 5);
    const MlmOutput out = mlm_step(model, 2);
    out.loss.backward();
    std::vector<double> result{out.loss.item()};
    for (const auto& p : model.named_parameters())
      for (double g : p.tensor.grad().to_vector<double>()) result.push_back(g);
    return result;
  };
  for (const auto layout : {RopeLayout::interleaved, RopeLayout::half}) {
    const std::vector<double> fused = run(AttentionKernel::kFusedRope, layout);
    const std::vector<double> separate = run(AttentionKernel::kSeparate, layout);
    ASSERT_EQ(fused.size(), separate.size());
    for (size_t i = 0; i < fused.size(); ++i)
      ASSERT_NEAR(fused[i], separate[i], 1e-5 * (1.0 + std::abs(separate[i]))) << "element " << i;
  }
  // cudnn_sdpa (no attention dropout): on the CPU the separate rope ops and
  // the CPU's attention kernels, so exactly `separate` (on CUDA:
  // tests/cuda/test_cudnn_sdpa.cpp).
  EXPECT_EQ(run(AttentionKernel::kCudnnSdpa, RopeLayout::interleaved, 0.0),
            run(AttentionKernel::kSeparate, RopeLayout::interleaved, 0.0));
}

// hidden_act gelu_new (the fused tanh-GELU feed-forward block, the tanh GELU
// in the head): close to the erf model with the same weights, not equal.
TEST(RoFormerOptions, GeluNewIsTheTanhApproximationOfGelu) {
  ModelConfig c = small_config();
  c.initializer_range = 0.3;
  RoFormerForMaskedLM erf_model(c, 5);
  c.hidden_act = "gelu_new";
  RoFormerForMaskedLM tanh_model(c, 5);
  const double erf_loss = mlm_step(erf_model, 1).loss.item();
  const double tanh_loss = mlm_step(tanh_model, 1).loss.item();
  EXPECT_NE(tanh_loss, erf_loss);
  EXPECT_NEAR(tanh_loss, erf_loss, 1e-2 * std::abs(erf_loss));
}

TEST(RoFormerMlm, HeadOnMaskedRowsEqualsFullLogits) {
  const RoFormerForMaskedLM model(small_config(), 3);
  const int64_t B = 2, S = 10, V = 97;
  const Tensor ids = random_ids(B, S, V, 8);
  const auto logits = model.mlm_logits(ids, Tensor(), Tensor()).to_vector<double>();
  auto best = [&](int64_t row) {
    const double* l = logits.data() + row * V;
    return int32_t(std::max_element(l, l + V) - l);
  };
  // Two rows labelled with their argmax (counted correct), two with another token.
  std::vector<int32_t> labels(size_t(B * S), -100);
  labels[1] = best(1);
  labels[7] = (best(7) + 1) % int32_t(V);
  labels[13] = best(13);
  labels[19] = (best(19) + 5) % int32_t(V);
  DropoutContext gen{1, 0};
  const MlmOutput out =
      model.forward_mlm(ids, Tensor(), Tensor(), Tensor::from_vector(labels, {B, S}), false, gen);
  EXPECT_EQ(out.num_masked, 4);
  double loss = 0;
  int64_t correct = 0;
  for (int64_t row : {1, 7, 13, 19}) {
    const double* l = logits.data() + row * V;
    const double m = *std::max_element(l, l + V);
    double z = 0;
    for (int64_t c = 0; c < V; ++c) z += std::exp(l[c] - m);
    loss += m + std::log(z) - l[labels[size_t(row)]];
    correct += std::max_element(l, l + V) - l == labels[size_t(row)];
  }
  EXPECT_NEAR(out.loss.item(), loss / 4, 1e-5);
  EXPECT_EQ(correct, 2);
  EXPECT_EQ(out.read().second, correct);
  EXPECT_NEAR(out.read().first, loss / 4, 1e-5);
  // Requested rows only: the same numbers.
  const Tensor some = model.mlm_logits(ids, Tensor(), Tensor(), Tensor::arange(7, 9));
  EXPECT_EQ(some.shape(), (Shape{2, V}));
  EXPECT_TRUE(
      all_close(some,
                Tensor::from_vector(
                    std::vector<double>(logits.begin() + 7 * V, logits.begin() + 9 * V), {2, V}),
                1e-6, 1e-6));
}

TEST(RoFormerMlm, PlainSgdLearnsATinyBatch) {
  // End to end: the gradients point downhill for every variant of attention.
  for (const auto kind : {AttentionKind::kSoftmax, AttentionKind::kLinear}) {
    ModelConfig c = small_config();
    c.attention = kind;
    RoFormerForMaskedLM model(c, 9);
    const double first = mlm_step(model, 1, false).loss.item();
    double last = first;
    for (int step = 0; step < 20; ++step) {
      model.zero_grad();
      const MlmOutput out = mlm_step(model, 1, false);
      out.loss.backward();
      NoGradGuard no_grad;
      for (Tensor p : model.parameters()) p.copy_(sub(p, mul(p.grad(), 0.1)));
      last = out.loss.item();
    }
    EXPECT_LT(last, 0.3 * first) << (kind == AttentionKind::kLinear ? "linear" : "softmax");
  }
}

// read() keeps an f64 loss in f64 (an f32 round trip would lose 1e-12).
TEST(RoFormerMlm, ReadKeepsTheLossPrecision) {
  MlmOutput out;
  out.loss = Tensor::full({}, 1.0 + 1e-12, DType::f64);
  out.correct = Tensor::full({}, 3.0, DType::f32);
  EXPECT_EQ(out.read(), (std::pair<double, int64_t>{1.0 + 1e-12, 3}));
}

TEST(RoFormerMlm, NoLabelledRowGivesZeroLossThatBackpropagates) {
  RoFormerForMaskedLM model(small_config(), 3);
  const Tensor ids = random_ids(1, 6, 97, 2);
  DropoutContext gen{1, 0};
  const MlmOutput out =
      model.forward_mlm(ids, Tensor(), Tensor(), Tensor::full({1, 6}, -100, DType::i32), true, gen);
  EXPECT_EQ(out.num_masked, 0);
  EXPECT_EQ(out.loss.item(), 0.0);
  EXPECT_EQ(out.read(), (std::pair<double, int64_t>{0.0, 0}));  // no row counted correct
  out.loss.backward();
  EXPECT_THROW(
      model.forward_mlm(ids, Tensor(), Tensor(), Tensor::full({1, 6}, 97, DType::i32), true, gen),
      InputError);
}

TEST(RoFormerMlm, DropoutIsDrivenByTheContext) {
  ModelConfig c = small_config();
  c.hidden_dropout_prob = 0.1;
  c.attention_probs_dropout_prob = 0.1;
  const RoFormerForMaskedLM model(c, 4);
  NoGradGuard no_grad;
  EXPECT_EQ(mlm_step(model, 1).loss.item(), mlm_step(model, 1).loss.item());
  EXPECT_NE(mlm_step(model, 1).loss.item(), mlm_step(model, 1, false).loss.item());
  EXPECT_EQ(mlm_step(model, 1, false).loss.item(), mlm_step(model, 1, false).loss.item());
}

TEST(RoFormerClassification, RegressionWithOneLabel) {
  RoFormerForSequenceClassification model(small_config(), 1, 2);
  const Tensor ids = random_ids(3, 8, 97, 4);
  const Tensor target = Tensor::from_vector<float>({0.5f, -1.0f, 2.0f}, {3});
  DropoutContext gen{1, 0};
  const ClassificationOutput out = model.forward(ids, Tensor(), Tensor(), target, false, gen);
  EXPECT_EQ(out.logits.shape(), (Shape{3, 1}));
  const auto l = out.logits.to_vector<double>();
  const double mse =
      ((l[0] - 0.5) * (l[0] - 0.5) + (l[1] + 1) * (l[1] + 1) + (l[2] - 2) * (l[2] - 2)) / 3;
  EXPECT_NEAR(out.loss.item(), mse, 1e-5);
  EXPECT_THROW(RoFormerForSequenceClassification(small_config(), 0, 1), InputError);
}

TEST(RoFormerProfile, TimesForwardAndBackwardByOpName) {
  RoFormerForMaskedLM model(small_config(), 3);
  profile_reset();
  set_profiling(true);
  mlm_step(model, 1).loss.backward();
  set_profiling(false);
  bool attention_fwd = false, attention_bwd = false, linear_bwd = false;
  for (const auto& e : profile_entries()) {
    if (e.name == "attention") {
      attention_fwd = e.forward_calls == 2;
      attention_bwd = e.backward_calls == 2;
    }
    if (e.name == "linear") linear_bwd = e.backward_calls > 0 && e.forward_calls > 0;
  }
  EXPECT_TRUE(attention_fwd && attention_bwd && linear_bwd) << profile_report();
  profile_reset();
}

// --- bf16 activations ---------------------------------------------------------------------

// Under a bf16 scope the encoder keeps its products' results in bf16 (core/
// precision.h): the loss and gradients stay those of bf16 products with f32
// activations to within bf16's precision, and the forward keeps fewer bytes
// alive for the backward.
TEST(RoFormerMixedPrecision, Bf16ActivationsKeepTheLossAndSaveMemory) {
  ModelConfig c = small_config();
  c.hidden_dropout_prob = 0.1;
  c.attention_probs_dropout_prob = 0.1;
  c.intermediate_size = 192;
  Allocator& alloc = allocator_for(Device::cpu());
  struct Run {
    double loss = 0, grad_norm = 0;
    size_t kept = 0;
  };
  auto run = [&](bool bf16_activations) {
    RoFormerForMaskedLM model(c, 9);
    MatmulPrecisionScope bf16_products(DType::bf16, bf16_activations);
    mlm_step(model, 4);  // casts the weights once: their copies are not activations
    Run r;
    const size_t before = alloc.stats().allocated_bytes;
    const MlmOutput out = mlm_step(model, 4);
    r.kept = alloc.stats().allocated_bytes - before;
    r.loss = out.loss.item();
    out.loss.backward();
    for (const auto& p : model.named_parameters())
      for (double g : p.tensor.grad().to_vector<double>()) r.grad_norm += g * g;
    r.grad_norm = std::sqrt(r.grad_norm);
    return r;
  };
  const Run f32_act = run(false), bf16_act = run(true);
  EXPECT_NEAR(bf16_act.loss, f32_act.loss, 2e-2 * f32_act.loss);
  EXPECT_NEAR(bf16_act.grad_norm, f32_act.grad_norm, 5e-2 * f32_act.grad_norm);
  EXPECT_LT(bf16_act.kept, f32_act.kept) << "bf16 activations kept " << bf16_act.kept
                                         << " bytes for the backward, f32 ones " << f32_act.kept;
}

// The MLM head's logits are bf16 under bf16 activations (torch's autocast
// too), f32 otherwise: with f32 activations, and outside a bf16 scope.
TEST(RoFormerMixedPrecision, TheMlmHeadWritesBf16LogitsUnderBf16Activations) {
  const RoFormerForMaskedLM model(small_config(), 3);
  const Tensor ids = random_ids(2, 8, model.config().vocab_size, 4);
  const Tensor mask = Tensor::ones({2, 8}, DType::i32);
  const Tensor rows = Tensor::from_vector<int64_t>({1, 5, 12}, {3});
  auto logits_dtype = [&](std::optional<bool> bf16_activations) {
    std::optional<MatmulPrecisionScope> scope;
    if (bf16_activations) scope.emplace(DType::bf16, *bf16_activations);
    return model.mlm_logits(ids, Tensor(), mask, rows).dtype();
  };
  EXPECT_EQ(logits_dtype(true), DType::bf16);
  EXPECT_EQ(logits_dtype(false), DType::f32);
  EXPECT_EQ(logits_dtype(std::nullopt), DType::f32);
}

}  // namespace
}  // namespace roformer
