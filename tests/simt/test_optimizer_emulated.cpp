// The optimizer's fused passes (core/cuda/optimizer.cu) run through the SIMT
// emulator against optim's CPU AdamW on the same flat buffers: parameters,
// moments and the bf16 working copy bit for bit (the kernel rounds every
// operation as the CPU loop does and fuses none), and the gradient norm's
// sum of squares and non-finite count. No GPU needed.
#include "tests/simt/emulated_optimizer.h"
//
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/flat_parameters.h"
#include "optim/adamw.h"
#include "optim/device_passes.h"
#include "tests/simt/emulated_test_support.h"

namespace roformer {
namespace {

using namespace testing::emulated;

std::vector<float> floats(const Tensor& t) {
  return t.contiguous().to_vector<float>();
}

TEST(OptimizerEmulated, FusedAdamWMatchesTheCpuAdamWBitForBit) {
  // Decayed, not decayed, no gradient (untouched), decayed: 1420 elements,
  // six blocks of 256, with the flat set's padding between them.
  Generator gen{5, 0};
  std::vector<optim::NamedParameter> params;
  const std::pair<int64_t, bool> layout[] = {{300, true}, {70, false}, {50, true}, {1000, true}};
  for (const auto& [n, decay] : layout) {
    Tensor t = Tensor::randn({n}, gen);
    t.set_requires_grad(true);
    params.push_back({std::string(1, char('a' + params.size())), t, decay});
  }
  optim::AdamWOptions options;
  options.weight_decay = 0.01;
  optim::AdamW adamw(params, options);
  const auto flat = FlatParameters::owner_of(adamw.parameters()[0].tensor);
  ASSERT_TRUE(flat);
  const double lr = 1e-3, grad_scale = 0.37;
  auto set_grads = [&] {
    for (size_t i = 0; i < adamw.parameters().size(); ++i)
      if (i != 2) {
        const Tensor& t = adamw.parameters()[i].tensor;
        t.set_grad(Tensor::randn(t.shape(), gen));
      }
  };
  // Two CPU steps first, so the moments are not zero.
  for (int s = 0; s < 2; ++s) {
    set_grads();
    adamw.step(lr, grad_scale);
  }
  set_grads();
  // The third step: emulated on copies of the flat buffers, then the CPU's.
  std::vector<float> p = floats(flat->data()), m = floats(adamw.exp_avg_shard()),
                     v = floats(adamw.exp_avg_sq_shard());
  const std::vector<float> g = floats(flat->grad());
  std::vector<optim::device_passes::Run> runs;
  for (size_t i = 0; i < flat->size(); ++i)
    if (flat->has_grad(i))
      runs.push_back({flat->offset(i), flat->offset(i) + flat->numel(i), params[i].decay});
  const int64_t n = flat->padded_numel();
  const optim::device_passes::Segments seg = optim::device_passes::segments_of(runs, n);
  simt_cuda::AdamWArgs a;
  a.lr = float(lr);
  a.beta1 = float(options.beta1);
  a.beta2 = float(options.beta2);
  a.eps = float(options.eps);
  a.step_size = float(lr / (1.0 - std::pow(options.beta1, 3.0)));
  a.bc2_sqrt = float(std::sqrt(1.0 - std::pow(options.beta2, 3.0)));
  a.grad_scale = float(grad_scale);
  a.decay = float(1.0 - lr * options.weight_decay);
  std::vector<uint16_t> working(size_t(n), 0xffff);
  // The update's sum of squares, measured in the same pass (scratch poisoned).
  std::vector<double> scratch(simt_cuda::adamw_update_scratch_bytes() / sizeof(double), NAN);
  double update_sq = NAN;
  simt_cuda::adamw_step(p.data(), g.data(), m.data(), v.data(), working.data(), n,
                        seg.starts.data(), seg.modes.data(), int(seg.modes.size()), a, nullptr,
                        &update_sq, scratch.data());
  const double cpu_update_sq = adamw.step(lr, grad_scale, true);
  EXPECT_GT(cpu_update_sq, 0.0);
  EXPECT_NEAR(update_sq, cpu_update_sq, 1e-12 * cpu_update_sq);
  EXPECT_EQ(p, floats(flat->data()));
  EXPECT_EQ(m, floats(adamw.exp_avg_shard()));
  EXPECT_EQ(v, floats(adamw.exp_avg_sq_shard()));
  const std::vector<float> rounded = flat->data().to(DType::bf16).to_vector<float>();
  for (size_t i = 0; i < working.size(); ++i) {
    const uint32_t bits = uint32_t(working[i]) << 16;
    float w;
    std::memcpy(&w, &bits, 4);
    ASSERT_EQ(w, rounded[i]) << "working copy element " << i;
  }
}

// The kernel moves a pack of eight elements as whole words only when every
// buffer starts on a pack boundary and the pack lies in one segment; buffers
// one float off those boundaries take every element alone. Both give the
// same bits, with segments that end inside packs.
TEST(OptimizerEmulated, FusedAdamWGivesTheSameBitsOnUnalignedBuffers) {
  Generator gen{9, 0};
  const int64_t n = 1001;
  const std::vector<float> p0 = Tensor::randn({n}, gen).to_vector<float>(),
                           g0 = Tensor::randn({n}, gen).to_vector<float>(),
                           m0 = Tensor::randn({n}, gen).to_vector<float>(),
                           v0 = Tensor::rand({n}, gen).to_vector<float>();
  const std::vector<int64_t> starts = {0, 333, 600, 803, n};
  const std::vector<uint8_t> modes = {simt_cuda::kSegmentDecay, simt_cuda::kSegmentNoDecay,
                                      simt_cuda::kSegmentSkip, simt_cuda::kSegmentDecay};
  simt_cuda::AdamWArgs a;
  a.step_size = 1e-3f;
  a.bc2_sqrt = 0.05f;
  a.grad_scale = 0.5f;
  a.decay = 0.999f;
  struct Result {
    std::vector<float> p, m, v;
    std::vector<uint16_t> working;
    double update_sq = NAN;
  };
  // The buffers at element `shift` of their vectors (16-byte aligned storage).
  auto run = [&](int64_t shift, bool measure) {
    std::vector<float> p(size_t(n + shift)), g(size_t(n + shift)), m(size_t(n + shift)),
        v(size_t(n + shift));
    std::copy(p0.begin(), p0.end(), p.begin() + shift);
    std::copy(g0.begin(), g0.end(), g.begin() + shift);
    std::copy(m0.begin(), m0.end(), m.begin() + shift);
    std::copy(v0.begin(), v0.end(), v.begin() + shift);
    std::vector<uint16_t> working(size_t(n + shift), 0xffff);
    std::vector<double> scratch(simt_cuda::adamw_update_scratch_bytes() / sizeof(double), NAN);
    Result r;
    simt_cuda::adamw_step(p.data() + shift, g.data() + shift, m.data() + shift, v.data() + shift,
                          working.data() + shift, n, starts.data(), modes.data(), int(modes.size()),
                          a, nullptr, measure ? &r.update_sq : nullptr,
                          measure ? scratch.data() : nullptr);
    r.p.assign(p.begin() + shift, p.end());
    r.m.assign(m.begin() + shift, m.end());
    r.v.assign(v.begin() + shift, v.end());
    r.working.assign(working.begin() + shift, working.end());
    return r;
  };
  for (const bool measure : {false, true}) {
    const Result packed = run(0, measure), alone = run(1, measure);
    EXPECT_EQ(packed.p, alone.p);
    EXPECT_EQ(packed.m, alone.m);
    EXPECT_EQ(packed.v, alone.v);
    EXPECT_EQ(packed.working, alone.working);
    // The skipped segment is untouched, and still in the working copy.
    for (int64_t i = 600; i < 803; ++i) {
      ASSERT_EQ(packed.p[size_t(i)], p0[size_t(i)]) << i;
      ASSERT_EQ(packed.m[size_t(i)], m0[size_t(i)]) << i;
      ASSERT_NE(packed.working[size_t(i)], 0xffff) << i;
    }
    EXPECT_NE(packed.p[0], p0[0]);
    if (measure) {
      double ref = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        const double d = double(packed.p[size_t(i)] - p0[size_t(i)]);
        ref += d * d;
      }
      EXPECT_GT(ref, 0.0);
      EXPECT_NEAR(packed.update_sq, ref, 1e-12 * ref);
      EXPECT_NEAR(alone.update_sq, ref, 1e-12 * ref);
    }
  }
}

TEST(OptimizerEmulated, GradNormStatsSumSquaresAndCountNonFinite) {
  Generator gen{21, 0};
  const int64_t n = 200003;  // more than the 512 x 256 threads of one sweep
  std::vector<float> g = Tensor::randn({n}, gen).to_vector<float>();
  std::vector<unsigned char> scratch(simt_cuda::grad_norm_scratch_bytes(), 0xff);
  auto run = [&] {
    simt_cuda::GradStats stats{NAN, 12345};
    simt_cuda::grad_norm_stats(g.data(), n, &stats, scratch.data(), nullptr);
    return stats;
  };
  const simt_cuda::GradStats first = run();
  double ref = 0.0;
  for (float x : g) ref += double(x) * double(x);
  EXPECT_NEAR(first.sum_squares, ref, 1e-12 * ref);
  EXPECT_EQ(first.non_finite, 0u);
  // One float off a pack boundary: every element loaded alone, the same sum
  // of the elements after the first.
  {
    simt_cuda::GradStats shifted{NAN, 12345};
    simt_cuda::grad_norm_stats(g.data() + 1, n - 1, &shifted, scratch.data(), nullptr);
    const double rest = ref - double(g[0]) * double(g[0]);
    EXPECT_NEAR(shifted.sum_squares, rest, 1e-12 * rest);
    EXPECT_EQ(shifted.non_finite, 0u);
  }
  g[5] = NAN;
  g[size_t(n - 1)] = INFINITY;
  const simt_cuda::GradStats bad = run();
  EXPECT_EQ(bad.non_finite, 2u);
  EXPECT_TRUE(std::isnan(bad.sum_squares));
}

}  // namespace
}  // namespace roformer
