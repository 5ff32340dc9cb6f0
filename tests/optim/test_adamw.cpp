#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/autograd.h"
#include "core/ops.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"

namespace roformer::optim {
namespace {

TEST(AdamW, OneStepMatchesTheFormulaWorkedByHand) {
  Tensor w = Tensor::from_vector<float>({1.0f, -2.0f}, {2});
  Tensor b = Tensor::from_vector<float>({0.5f}, {1});
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  w.set_grad(Tensor::from_vector<float>({0.1f, -0.3f}, {2}));
  b.set_grad(Tensor::from_vector<float>({2.0f}, {1}));
  AdamW opt({{"layer.weight", w, true}, {"layer.bias", b, false}}, {0.9, 0.999, 1e-8, 0.1});
  EXPECT_TRUE(std::isnan(opt.step(0.01))) << "the update is measured only when asked";
  // Step 1: m = 0.1 g, v = 0.001 g^2, m_hat = g, v_hat = g^2, update = lr * g/(|g| + eps).
  auto expected = [](double p, double g, double decay) {
    p *= 1.0 - 0.01 * decay;
    const double m = 0.1 * g, v = 0.001 * g * g;
    return p - (0.01 / 0.1) * m / (std::sqrt(v) / std::sqrt(0.001) + 1e-8);
  };
  const auto wv = w.to_vector<float>();
  EXPECT_NEAR(wv[0], expected(1.0, 0.1, 0.1), 1e-6);
  EXPECT_NEAR(wv[1], expected(-2.0, -0.3, 0.1), 1e-6);
  EXPECT_NEAR(b.to_vector<float>()[0], expected(0.5, 2.0, 0.0), 1e-6);
  EXPECT_EQ(opt.step_count(), 1);
}

TEST(AdamW, TenStepsMatchTorchOptimAdamW) {
  std::ifstream in(std::string(ROFORMER_FIXTURES_DIR) + "/adamw_golden.json");
  ASSERT_TRUE(in) << "missing fixture adamw_golden.json";
  const auto golden = nlohmann::json::parse(in);
  std::vector<NamedParameter> params;
  for (auto& [name, shape_json] : golden["shapes"].items()) {
    const Shape shape = shape_json.get<Shape>();
    Tensor t = Tensor::from_vector<float>(golden["initial"][name].get<std::vector<float>>(), shape);
    t.set_requires_grad(true);
    params.push_back({name, t, decays_by_default(name)});
  }
  ASSERT_FALSE(params[0].name.empty());
  for (const auto& p : params) {
    const bool listed_no_decay = std::find(golden["no_decay"].begin(), golden["no_decay"].end(),
                                           p.name) != golden["no_decay"].end();
    EXPECT_EQ(p.decay, !listed_no_decay) << p.name;
  }
  AdamW opt(params,
            {golden["betas"][0], golden["betas"][1], golden["eps"], golden["weight_decay"]});
  for (const auto& step_grads : golden["grads"]) {
    for (auto& p : params)
      p.tensor.set_grad(Tensor::from_vector<float>(step_grads[p.name].get<std::vector<float>>(),
                                                   p.tensor.shape()));
    opt.step(golden["lr"]);
  }
  for (const auto& p : params) {
    const auto got = p.tensor.to_vector<float>();
    const auto want = golden["final"][p.name].get<std::vector<float>>();
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_NEAR(got[i], want[i], 1e-6 * (1 + std::abs(want[i]))) << p.name << "[" << i << "]";
  }
  // The moments match too (flat buffers in parameter order).
  const auto m = opt.exp_avg().to_vector<float>();
  size_t offset = 0;
  for (const auto& p : params) {
    const auto want = golden["exp_avg"][p.name].get<std::vector<float>>();
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(m[offset + i], want[i], 1e-6 * (1 + std::abs(want[i])));
    offset += want.size();
  }
}

TEST(AdamW, SkipsParametersWithoutGradientsAndRejectsNonF32) {
  Tensor a = Tensor::ones({3});
  a.set_requires_grad(true);
  AdamW opt({{"a.weight", a, true}}, {});
  opt.step(0.1);
  EXPECT_EQ(a.to_vector<float>(), std::vector<float>(3, 1.0f));
  Tensor d = Tensor::ones({3}, DType::f64);
  EXPECT_THROW(AdamW({{"d", d, true}}, {}), Error);
}

TEST(AdamW, DecayDefaults) {
  EXPECT_TRUE(decays_by_default("roformer.encoder.layer.0.attention.self.query.weight"));
  EXPECT_FALSE(decays_by_default("roformer.encoder.layer.0.attention.self.query.bias"));
  EXPECT_FALSE(decays_by_default("roformer.embeddings.LayerNorm.weight"));
  EXPECT_FALSE(decays_by_default("cls.predictions.bias"));
}

TEST(Clipping, GlobalNormAndScale) {
  Tensor a = Tensor::ones({4}), b = Tensor::ones({1});
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  a.set_grad(Tensor::full({4}, 3.0));
  b.set_grad(Tensor::full({1}, 6.0));
  const std::vector<NamedParameter> params{{"a", a, true}, {"b", b, true}};
  const double norm = global_grad_norm(params);
  EXPECT_NEAR(norm, std::sqrt(4 * 9.0 + 36.0), 1e-12);
  EXPECT_NEAR(clip_scale(norm, 1.0), 1.0 / (norm + 1e-6), 1e-12);
  EXPECT_EQ(clip_scale(norm, 100.0), 1.0);
  EXPECT_EQ(clip_scale(norm, 0.0), 1.0);
  // Clipping folded into the step: a huge gradient moves a parameter no more
  // than a unit one would at step 1 (Adam normalises), but the moments differ.
  AdamW opt(params, {0.9, 0.999, 1e-8, 0.0});
  opt.step(0.1, clip_scale(norm, 1.0));
  EXPECT_NEAR(opt.exp_avg().to_vector<float>()[0], 0.1 * 3.0 / (norm + 1e-6), 1e-6);
  b.set_grad(Tensor::full({1}, std::nan("")));
  EXPECT_TRUE(std::isnan(global_grad_norm(params)));
}

TEST(Clipping, ChunkPartialsOfSlicesAddUpToTheWholeNormBitForBit) {
  // ZeRO-1's norm: each rank sums squares over its slice of the gradient
  // (whole chunks), the partials are added in chunk order.
  Generator gen{7, 0};
  const int64_t n = 5 * kNormChunk + 123;
  Tensor x = mul(Tensor::randn({n}, gen), 3.7);
  const double whole = sum_of_squares(x);
  for (const std::vector<int64_t>& cuts : {std::vector<int64_t>{0, n},
                                           {0, kNormChunk, n},
                                           {0, 2 * kNormChunk, 4 * kNormChunk, n},
                                           {0, 0, 5 * kNormChunk, n}}) {
    std::vector<double> partials;
    for (size_t r = 0; r + 1 < cuts.size(); ++r) {
      const std::vector<double> p = chunk_sums_of_squares(x, cuts[r], cuts[r + 1]);
      EXPECT_EQ(int64_t(p.size()), (cuts[r + 1] - cuts[r] + kNormChunk - 1) / kNormChunk);
      partials.insert(partials.end(), p.begin(), p.end());
    }
    EXPECT_EQ(sum_in_order(partials), whole) << cuts.size() - 1 << " slices";
  }
  // A range that splits a chunk cannot give the whole sum's partials.
  EXPECT_THROW(chunk_sums_of_squares(x, 16, n), Error);
  EXPECT_THROW(chunk_sums_of_squares(x, 0, kNormChunk + 16), Error);
  EXPECT_THROW(chunk_sums_of_squares(x, 0, n + 1), Error);
  // A non-finite element makes its slice's partial, and so the norm, non-finite.
  x.data_as<float>()[n - 1] = std::nanf("");
  EXPECT_TRUE(std::isnan(sum_in_order(chunk_sums_of_squares(x, 5 * kNormChunk, n))));
  EXPECT_TRUE(std::isfinite(sum_in_order(chunk_sums_of_squares(x, 0, 5 * kNormChunk))));
}

Tensor random_param(const Shape& shape, uint64_t seed) {
  Generator gen{seed, 0};
  return Tensor::randn(shape, gen).set_requires_grad(true);
}

TEST(AdamW, OnePassOverTheFlatBuffersMatchesThePerElementFormula) {
  // Three parameters: one without a gradient (left untouched), one decayed,
  // one not; odd sizes so slices have padding between them.
  const Tensor idle = random_param({5}, 1), w = random_param({70000}, 2), b = random_param({33}, 3);
  const auto idle0 = idle.to_vector<float>(), w0 = w.to_vector<float>(), b0 = b.to_vector<float>();
  AdamW opt({{"idle.weight", idle, true}, {"w.weight", w, true}, {"w.bias", b, false}},
            {0.9, 0.999, 1e-8, 0.1});
  // The constructor flattened them: the optimizer walks one buffer.
  EXPECT_EQ(FlatParameters::of({idle, w, b}).get(), &opt.flat());
  Generator gen{4, 0};
  const Tensor gw = Tensor::randn({70000}, gen), gb = Tensor::randn({33}, gen);
  const double lr = 0.01, scale = 0.5;
  auto expected = [&](double p, double g, double decay) {  // step 1, in double
    g *= scale;
    p *= 1.0 - lr * decay;
    const double m = 0.1 * g, v = 0.001 * g * g;
    return p - (lr / 0.1) * m / (std::sqrt(v) / std::sqrt(0.001) + 1e-8);
  };
  w.set_grad(gw);
  b.set_grad(gb);
  opt.step(lr, scale);
  EXPECT_EQ(idle.to_vector<float>(), idle0);
  const auto w1 = w.to_vector<float>(), b1 = b.to_vector<float>();
  const auto gwv = gw.to_vector<float>(), gbv = gb.to_vector<float>();
  for (size_t i = 0; i < w1.size(); i += 997)
    EXPECT_NEAR(w1[i], expected(w0[i], gwv[i], 0.1), 1e-6 * (1 + std::abs(w1[i]))) << i;
  for (size_t i = 0; i < b1.size(); ++i)
    EXPECT_NEAR(b1[i], expected(b0[i], gbv[i], 0.0), 1e-6 * (1 + std::abs(b1[i]))) << i;
  // Moments come out packed in parameter order (no padding): zeros for idle.
  const auto m = opt.exp_avg().to_vector<float>();
  ASSERT_EQ(int64_t(m.size()), 5 + 70000 + 33);
  EXPECT_EQ(m[4], 0.0f);
  EXPECT_FLOAT_EQ(m[5], float(0.1 * scale) * gwv[0]);
  EXPECT_FLOAT_EQ(m[5 + 70000], float(0.1 * scale) * gbv[0]);
}

TEST(AdamW, SavedStateResumesBitForBit) {
  auto make = [](uint64_t seed) {
    return std::vector<NamedParameter>{{"a.weight", random_param({40000}, seed), true},
                                       {"a.bias", random_param({7}, seed + 1), false}};
  };
  auto grads = [](std::vector<NamedParameter>& ps, uint64_t seed) {
    Generator gen{seed, 0};
    for (auto& p : ps) p.tensor.set_grad(Tensor::randn(p.tensor.shape(), gen));
  };
  std::vector<NamedParameter> straight = make(10), resumed = make(10);
  AdamW a(straight, {});
  for (uint64_t s = 0; s < 3; ++s) {
    grads(straight, 100 + s);
    a.step(1e-3);
  }
  // A second optimizer on copies of the parameters, loaded from packed state.
  for (size_t i = 0; i < resumed.size(); ++i) {
    NoGradGuard no_grad;
    resumed[i].tensor.copy_(straight[i].tensor);
  }
  AdamW b(resumed, {});
  b.load_state(a.exp_avg(), a.exp_avg_sq(), a.step_count());
  grads(straight, 200);
  grads(resumed, 200);
  a.step(1e-3);
  b.step(1e-3);
  for (size_t i = 0; i < straight.size(); ++i)
    EXPECT_EQ(straight[i].tensor.to_vector<float>(), resumed[i].tensor.to_vector<float>());
  EXPECT_THROW(b.load_state(Tensor::zeros({3}), Tensor::zeros({3}), 1), InputError);
}

TEST(AdamW, ShardBoundsAreAlignedContiguousAndCoverTheBuffer) {
  for (int64_t n : {int64_t(0), int64_t(16), int64_t(48), 5 * AdamW::kShardAlignment - 16,
                    5 * AdamW::kShardAlignment, 7 * AdamW::kShardAlignment + 48}) {
    for (int count : {1, 2, 3, 7}) {
      const std::vector<int64_t> b = AdamW::shard_bounds(n, count);
      ASSERT_EQ(b.size(), size_t(count) + 1);
      EXPECT_EQ(b.front(), 0);
      EXPECT_EQ(b.back(), n);
      for (int r = 0; r < count; ++r) {
        EXPECT_LE(b[r], b[r + 1]);
        EXPECT_LE(b[r + 1] - b[r], b[1] - b[0]) << "share " << r << " larger than the first";
        if (b[r] < n) {
          EXPECT_EQ(b[r] % AdamW::kShardAlignment, 0);
        }
      }
      // A share is at most one alignment unit above an even split.
      EXPECT_LE(b[1] - b[0], (n + count - 1) / count + AdamW::kShardAlignment);
    }
  }
}

TEST(AdamW, ShardedMomentsGiveBitIdenticalUpdatesAndResumeFromWholeState) {
  // The whole optimizer and three sharded ones on copies of the same
  // parameters; after each sharded step the shares are copied across (the
  // all-gather of train/distributed/zero.h).
  auto make = [](uint64_t seed) {
    return std::vector<NamedParameter>{{"a.weight", random_param({40000}, seed), true},
                                       {"a.bias", random_param({7}, seed + 1), false},
                                       {"b.weight", random_param({333}, seed + 2), true}};
  };
  constexpr int kShards = 3;
  std::vector<NamedParameter> whole_params = make(20);
  AdamW whole(whole_params, {0.9, 0.999, 1e-8, 0.1});
  std::vector<std::vector<NamedParameter>> copies;
  std::vector<std::unique_ptr<AdamW>> shards;
  for (int r = 0; r < kShards; ++r) {
    copies.push_back(make(20));
    shards.push_back(std::make_unique<AdamW>(copies.back(), AdamWOptions{0.9, 0.999, 1e-8, 0.1},
                                             MomentShard{r, kShards}));
  }
  EXPECT_THROW(shards[0]->exp_avg(), Error);
  const std::vector<int64_t> bounds = AdamW::shard_bounds(whole.flat().padded_numel(), kShards);
  int64_t state = 0;
  for (int r = 0; r < kShards; ++r) {
    EXPECT_EQ(shards[r]->shard_begin(), bounds[r]);
    EXPECT_EQ(shards[r]->shard_end(), bounds[r + 1]);
    state += shards[r]->state_bytes();
  }
  EXPECT_EQ(state, whole.state_bytes());

  auto step_all = [&](uint64_t seed) {
    auto grads = [seed](std::vector<NamedParameter>& ps, bool skip_bias) {
      Generator gen{seed, 0};
      for (auto& p : ps) {
        const Tensor g = Tensor::randn(p.tensor.shape(), gen);
        if (!(skip_bias && p.name == "a.bias")) p.tensor.set_grad(g);
      }
    };
    const bool skip_bias = seed % 2 == 1;  // parameters without a gradient stay put
    grads(whole_params, skip_bias);
    // The measured update is sum((after - before)^2) of the f32 weights, and
    // the shards' measures add up to the whole's.
    const std::vector<float> before = whole.flat().data().to_vector<float>();
    const double whole_sq = whole.step(1e-2, 0.7, true);
    const std::vector<float> after = whole.flat().data().to_vector<float>();
    double want = 0.0;
    for (size_t i = 0; i < after.size(); ++i) {
      const double change = double(after[i] - before[i]);
      want += change * change;
    }
    EXPECT_GT(want, 0.0);
    EXPECT_NEAR(whole_sq, want, 1e-12 * want);
    whole.zero_grad();
    double shards_sq = 0.0;
    for (int r = 0; r < kShards; ++r) {
      grads(copies[r], skip_bias);
      shards_sq += shards[r]->step(1e-2, 0.7, true);
      shards[r]->zero_grad();
    }
    EXPECT_NEAR(shards_sq, whole_sq, 1e-12 * whole_sq);
    for (int r = 0; r < kShards; ++r)
      for (int o = 0; o < kShards; ++o)
        std::copy(shards[r]->flat().data().data_as<float>() + bounds[r],
                  shards[r]->flat().data().data_as<float>() + bounds[r + 1],
                  shards[o]->flat().data().data_as<float>() + bounds[r]);
  };
  auto expect_same = [&](const char* when) {
    for (int r = 0; r < kShards; ++r)
      EXPECT_EQ(shards[r]->flat().data().to_vector<float>(), whole.flat().data().to_vector<float>())
          << when << ", copy " << r;
  };
  for (uint64_t s = 0; s < 4; ++s) step_all(300 + s);
  expect_same("after 4 steps");

  // The shares laid side by side are the whole optimizer's moments.
  Tensor m = Tensor::zeros({whole.flat().padded_numel()});
  for (int r = 0; r < kShards; ++r)
    std::copy_n(shards[r]->exp_avg_shard().data_as<float>(), bounds[r + 1] - bounds[r],
                m.data_as<float>() + bounds[r]);
  EXPECT_EQ(whole.flat().pack(m).to_vector<float>(), whole.exp_avg().to_vector<float>());

  // Sharded optimizers loaded from the whole state continue identically.
  for (int r = 0; r < kShards; ++r) {
    copies[r] = make(99);
    for (size_t i = 0; i < copies[r].size(); ++i) {
      NoGradGuard no_grad;
      copies[r][i].tensor.copy_(whole_params[i].tensor);
    }
    shards[r] = std::make_unique<AdamW>(copies[r], AdamWOptions{0.9, 0.999, 1e-8, 0.1},
                                        MomentShard{r, kShards});
    shards[r]->load_state(whole.exp_avg(), whole.exp_avg_sq(), whole.step_count());
  }
  for (uint64_t s = 0; s < 2; ++s) step_all(400 + s);
  expect_same("after resuming from the whole state");
}

TEST(AdamW, RejectsPartOfAFlatSet) {
  const Tensor a = random_param({4}, 5), b = random_param({4}, 6);
  const auto flat = FlatParameters::create({a, b});
  try {
    AdamW opt({{"b.weight", b, true}}, {});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'b.weight'"), std::string::npos) << e.what();
  }
  AdamW whole({{"a.weight", a, true}, {"b.weight", b, true}}, {});
  EXPECT_EQ(&whole.flat(), flat.get());
}

TEST(Clipping, GradNormIsBitIdenticalForOneAndTwoThreads) {
  // Large enough for many chunks; a wide spread of magnitudes so that the
  // summation order would show in the last bits.
  std::vector<NamedParameter> params;
  Generator gen{7, 0};
  for (int64_t n : {100003, 5, 250000, 33}) {
    Tensor p = random_param({n}, uint64_t(n));
    p.set_grad(mul(Tensor::randn({n}, gen), exp(mul(Tensor::randn({n}, gen), 3.0))));
    params.push_back({"p" + std::to_string(n), p, true});
  }
  const int threads = omp_get_max_threads();
  // Not flat: parameter by parameter.
  omp_set_num_threads(1);
  const double loose1 = global_grad_norm(params);
  omp_set_num_threads(2);
  const double loose2 = global_grad_norm(params);
  AdamW opt(params, {});  // flattens them
  const double flat2 = global_grad_norm(params);
  omp_set_num_threads(1);
  const double flat1 = global_grad_norm(params);
  omp_set_num_threads(threads);
  EXPECT_EQ(std::memcmp(&loose1, &loose2, sizeof(double)), 0) << loose1 << " vs " << loose2;
  EXPECT_EQ(std::memcmp(&flat1, &flat2, sizeof(double)), 0) << flat1 << " vs " << flat2;
  EXPECT_EQ(flat1, grad_norm(opt.flat()));
  // Against a long-double reference.
  long double ref = 0;
  for (const auto& p : params)
    for (float g : p.tensor.grad().to_vector<float>()) ref += (long double)g * g;
  EXPECT_NEAR(flat1, std::sqrt(double(ref)), 1e-12 * std::sqrt(double(ref)));
  EXPECT_NEAR(loose1, flat1, 1e-12 * flat1);
}

TEST(LrSchedule, WarmupThenLinearDecayAcrossStages) {
  LrSchedule s(DecayKind::linear, 1e-3, 10, 0.0, {{50, {}, {}}, {50, {}, {}}});
  EXPECT_EQ(s.total_steps(), 100);
  EXPECT_NEAR(s.at(0), 1e-4, 1e-12);
  EXPECT_NEAR(s.at(9), 1e-3, 1e-12);
  EXPECT_NEAR(s.at(10), 1e-3, 1e-12);
  EXPECT_NEAR(s.at(55), 1e-3 * (1 - 45.0 / 90.0), 1e-12);  // decay spans stages
  EXPECT_NEAR(s.at(100), 0.0, 1e-12);
}

TEST(LrSchedule, CosineConstantMinRatio) {
  LrSchedule cosine(DecayKind::cosine, 2.0, 0, 0.1, {{100, {}, {}}});
  EXPECT_NEAR(cosine.at(0), 2.0, 1e-12);
  EXPECT_NEAR(cosine.at(50), 2.0 * (0.1 + 0.9 * 0.5), 1e-12);
  EXPECT_NEAR(cosine.at(100), 0.2, 1e-12);
  LrSchedule constant(DecayKind::constant, 0.5, 4, 0.0, {{100, {}, {}}});
  EXPECT_NEAR(constant.at(1), 0.25, 1e-12);
  EXPECT_NEAR(constant.at(99), 0.5, 1e-12);
  EXPECT_THROW(parse_decay_kind("exponential"), InputError);
}

TEST(LrSchedule, PerStagePeakAndReWarmup) {
  LrSchedule s(DecayKind::constant, 1.0, 0, 0.0, {{10, {}, {}}, {10, 0.5, 5}});
  EXPECT_NEAR(s.at(9), 1.0, 1e-12);
  EXPECT_NEAR(s.at(10), 0.5 * 1.0 / 5.0, 1e-12);  // stage 2 ramps up again
  EXPECT_NEAR(s.at(14), 0.5, 1e-12);
  EXPECT_NEAR(s.at(19), 0.5, 1e-12);
}

}  // namespace
}  // namespace roformer::optim
