// softmax / log_softmax, layer_norm, gelu, dropout, embedding, cross_entropy:
// forward against plain loops written here, f64 finite-difference gradients,
// the f32 (oneDNN or vectorised) backward against the f64 loop backward, and
// the errors users see.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/ops.h"
#include "core/ops/dispatch.h"
#include "core/philox.h"
#include "gradcheck.h"

namespace roformer {
namespace {

using testing::all_close;
using testing::gradcheck;
using testing::random_f64;

// Random tensor of `dtype` with values in [lo, hi).
Tensor random(const Shape& shape, uint64_t seed, DType dtype = DType::f32, double lo = -1.0,
              double hi = 1.0) {
  NoGradGuard no_grad;
  return random_f64(shape, seed, lo, hi).to(dtype);
}

// The same values as `t` in a transposed (non-contiguous) layout: a [cols,
// rows] tensor viewed as [rows, cols].
Tensor transposed_copy(const Tensor& t) {
  NoGradGuard no_grad;
  Tensor tt = t.transpose(0, 1).contiguous().transpose(0, 1);
  EXPECT_FALSE(tt.is_contiguous());
  return tt;
}

// Runs fn, expects an Error whose message contains every part.
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' missing from: " << msg;
  }
}

// Gradient of sum(f(x) * r) for x (cast to `dtype`), returned as f64.
std::vector<Tensor> grads_of(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                             const std::vector<Tensor>& inputs_f64, DType dtype, const Tensor& r) {
  std::vector<Tensor> inputs;
  for (const Tensor& t : inputs_f64) {
    if (is_floating(t.dtype()))
      inputs.push_back(t.to(dtype).detach().clone().set_requires_grad(true));
    else
      inputs.push_back(t);
  }
  const Tensor y = f(inputs);  // a loss may be wider than its inputs (f32 for bf16)
  sum(mul(y, r.to(y.dtype()))).backward();
  std::vector<Tensor> grads;
  for (const Tensor& t : inputs)
    grads.push_back(t.requires_grad() ? t.grad().to(DType::f64) : Tensor());
  return grads;
}

// The f32 backward (oneDNN or the vectorised loop) agrees with the f64 loop.
void expect_f32_backward_matches_f64(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                                     const std::vector<Tensor>& inputs_f64, double rtol = 1e-4,
                                     double atol = 1e-5, DType dtype = DType::f32) {
  Tensor out;
  {
    NoGradGuard no_grad;
    out = f(inputs_f64);
  }
  const Tensor r = random(out.shape(), 4242, DType::f64);
  const auto g64 = grads_of(f, inputs_f64, DType::f64, r);
  const auto g32 = grads_of(f, inputs_f64, dtype, r);
  for (size_t k = 0; k < g64.size(); ++k) {
    if (!g64[k].defined()) continue;
    ASSERT_TRUE(g32[k].defined()) << "input " << k;
    EXPECT_TRUE(all_close(g32[k], g64[k], rtol, atol)) << "input " << k;
  }
}

// --- reference loops ----------------------------------------------------------

std::vector<double> ref_softmax(const std::vector<double>& x, int64_t cols, bool log) {
  std::vector<double> y(x.size());
  for (size_t r = 0; r < x.size() / size_t(cols); ++r) {
    const double* xr = x.data() + r * cols;
    double m = -std::numeric_limits<double>::infinity(), s = 0;
    for (int64_t c = 0; c < cols; ++c) m = std::max(m, xr[c]);
    for (int64_t c = 0; c < cols; ++c) s += std::exp(xr[c] - m);
    for (int64_t c = 0; c < cols; ++c)
      y[r * cols + c] = log ? xr[c] - m - std::log(s) : std::exp(xr[c] - m) / s;
  }
  return y;
}

std::vector<double> ref_layer_norm(const std::vector<double>& x, const std::vector<double>& w,
                                   const std::vector<double>& b, int64_t cols, double eps) {
  std::vector<double> y(x.size());
  for (size_t r = 0; r < x.size() / size_t(cols); ++r) {
    const double* xr = x.data() + r * cols;
    double m = 0, v = 0;
    for (int64_t c = 0; c < cols; ++c) m += xr[c] / double(cols);
    for (int64_t c = 0; c < cols; ++c) v += (xr[c] - m) * (xr[c] - m) / double(cols);
    for (int64_t c = 0; c < cols; ++c)
      y[r * cols + c] =
          (xr[c] - m) / std::sqrt(v + eps) * (w.empty() ? 1.0 : w[c]) + (b.empty() ? 0.0 : b[c]);
  }
  return y;
}

double ref_gelu(double x) {
  return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
}

// Mean NLL over counted rows (double loop).
double ref_cross_entropy(const std::vector<double>& x, const std::vector<int64_t>& t, int64_t cols,
                         int64_t ignore_index) {
  const std::vector<double> ls = ref_softmax(x, cols, true);
  double total = 0;
  int64_t count = 0;
  for (size_t r = 0; r < t.size(); ++r) {
    if (t[r] == ignore_index) continue;
    total -= ls[r * cols + t[r]];
    ++count;
  }
  return count ? total / double(count) : 0.0;
}

Tensor from_doubles(const std::vector<double>& v, const Shape& shape) {
  return Tensor::from_vector<double>(v, shape);
}

// --- softmax / log_softmax ----------------------------------------------------

TEST(Softmax, ForwardMatchesReferenceLoopIncludingViews) {
  for (bool log : {false, true}) {
    auto op = [log](const Tensor& x) { return log ? log_softmax(x) : softmax(x); };
    for (DType dtype : {DType::f32, DType::f64}) {
      const Tensor x = random({5, 37}, 1, dtype, -6.0, 6.0);
      const auto want = ref_softmax(x.to_vector<double>(), 37, log);
      EXPECT_TRUE(all_close(op(x), from_doubles(want, {5, 37}), 1e-5, 1e-6)) << log;
      // A transposed view gives the same result as its contiguous copy.
      EXPECT_TRUE(all_close(op(transposed_copy(x)), from_doubles(want, {5, 37}), 1e-5, 1e-6));
    }
    // 3-D: the last dim only.
    const Tensor x3 = random({2, 3, 9}, 2, DType::f32, -3.0, 3.0);
    EXPECT_TRUE(
        all_close(op(x3), from_doubles(ref_softmax(x3.to_vector<double>(), 9, log), {2, 3, 9})));
    // bf16 (oneDNN or the loop) is within bf16 rounding of the exact result.
    const Tensor xb = random({4, 50}, 3, DType::bf16, -4.0, 4.0);
    const Tensor yb = op(xb);
    EXPECT_EQ(yb.dtype(), DType::bf16);
    EXPECT_TRUE(all_close(yb, from_doubles(ref_softmax(xb.to_vector<double>(), 50, log), {4, 50}),
                          1e-2, 1e-3));
  }
  // Rows sum to one and large logits do not overflow.
  const Tensor big = from_doubles({1000, 1001, 1002, -1000}, {1, 4}).to(DType::f32);
  const auto p = softmax(big).to_vector<double>();
  EXPECT_NEAR(p[0] + p[1] + p[2] + p[3], 1.0, 1e-6);
  EXPECT_NEAR(p[2], 1.0 / (1.0 + std::exp(-1.0) + std::exp(-2.0)), 1e-6);
}

TEST(Softmax, GradcheckF64) {
  EXPECT_TRUE(
      gradcheck([](const auto& in) { return softmax(in[0]); }, {random_f64({3, 6}, 10, -2, 2)}));
  EXPECT_TRUE(gradcheck([](const auto& in) { return log_softmax(in[0]); },
                        {random_f64({3, 6}, 11, -2, 2)}));
  // Through a transposed view.
  EXPECT_TRUE(gradcheck([](const auto& in) { return log_softmax(in[0].transpose(0, 1)); },
                        {random_f64({4, 3}, 12, -2, 2)}));
}

TEST(Softmax, OnednnBackwardMatchesF64Loop) {
  expect_f32_backward_matches_f64([](const auto& in) { return softmax(in[0]); },
                                  {random_f64({7, 130}, 20, -3, 3)});
  expect_f32_backward_matches_f64([](const auto& in) { return log_softmax(in[0]); },
                                  {random_f64({7, 130}, 21, -3, 3)});
}

TEST(Softmax, ErrorsNameOpAndTensor) {
  expect_error([] { softmax(Tensor::zeros({2, 3}, DType::i64)); }, {"softmax", "i64[2, 3]"});
  expect_error([] { log_softmax(Tensor::zeros({}, DType::f32)); }, {"log_softmax", "f32[]"});
}

// --- layer_norm -------------------------------------------------------------------

TEST(LayerNorm, ForwardMatchesReferenceLoopIncludingViews) {
  for (DType dtype : {DType::f32, DType::f64}) {
    const Tensor x = random({6, 24}, 30, dtype, -2.0, 3.0);
    const Tensor w = random({24}, 31, dtype, 0.5, 1.5), b = random({24}, 32, dtype);
    const auto want = from_doubles(ref_layer_norm(x.to_vector<double>(), w.to_vector<double>(),
                                                  b.to_vector<double>(), 24, 1e-5),
                                   {6, 24});
    EXPECT_TRUE(all_close(layer_norm(x, w, b, 1e-5), want, 1e-5, 1e-5));
    EXPECT_TRUE(all_close(layer_norm(transposed_copy(x), w, b, 1e-5), want, 1e-5, 1e-5));
    // No affine parameters.
    EXPECT_TRUE(
        all_close(layer_norm(x, Tensor(), Tensor(), 1e-5),
                  from_doubles(ref_layer_norm(x.to_vector<double>(), {}, {}, 24, 1e-5), {6, 24}),
                  1e-5, 1e-5));
  }
  // 3-D input and bf16.
  const Tensor x3 = random({2, 3, 16}, 33, DType::f32, -1, 1);
  const Tensor w = random({16}, 34), b = random({16}, 35);
  const auto want3 = ref_layer_norm(x3.to_vector<double>(), w.to_vector<double>(),
                                    b.to_vector<double>(), 16, 1e-12);
  EXPECT_TRUE(all_close(layer_norm(x3, w, b, 1e-12), from_doubles(want3, {2, 3, 16}), 1e-5, 1e-5));
  const Tensor yb = layer_norm(x3.to(DType::bf16), w.to(DType::bf16), b.to(DType::bf16), 1e-12);
  EXPECT_EQ(yb.dtype(), DType::bf16);
  EXPECT_TRUE(all_close(yb, from_doubles(want3, {2, 3, 16}), 2e-2, 2e-2));
}

TEST(LayerNorm, GradcheckF64) {
  EXPECT_TRUE(gradcheck(
      [](const auto& in) { return layer_norm(in[0], in[1], in[2], 1e-5); },
      {random_f64({4, 7}, 40, -2, 2), random_f64({7}, 41, 0.5, 1.5), random_f64({7}, 42)}));
  EXPECT_TRUE(gradcheck([](const auto& in) { return layer_norm(in[0], Tensor(), Tensor(), 1e-5); },
                        {random_f64({3, 5}, 43, -2, 2)}));
  EXPECT_TRUE(
      gradcheck([](const auto& in) { return layer_norm(in[0].transpose(0, 1), in[1], in[2], 0.1); },
                {random_f64({5, 3}, 44, -2, 2), random_f64({5}, 45), random_f64({5}, 46)}));
}

TEST(LayerNorm, OnednnBackwardMatchesF64Loop) {
  expect_f32_backward_matches_f64(
      [](const auto& in) { return layer_norm(in[0], in[1], in[2], 1e-5); },
      {random_f64({33, 96}, 50, -2, 2), random_f64({96}, 51, 0.5, 1.5), random_f64({96}, 52)}, 1e-3,
      1e-4);
  expect_f32_backward_matches_f64(
      [](const auto& in) { return layer_norm(in[0], in[1], Tensor(), 1e-5); },
      {random_f64({5, 40}, 53, -2, 2), random_f64({40}, 54, 0.5, 1.5)}, 1e-3, 1e-4);
}

TEST(LayerNorm, OnednnBackwardWithoutAffineOrWithBiasOnly) {
  expect_f32_backward_matches_f64(
      [](const auto& in) { return layer_norm(in[0], Tensor(), Tensor(), 1e-5); },
      {random_f64({5, 40}, 57, -2, 2)}, 1e-3, 1e-4);
  expect_f32_backward_matches_f64(
      [](const auto& in) { return layer_norm(in[0], Tensor(), in[1], 1e-5); },
      {random_f64({5, 40}, 58, -2, 2), random_f64({40}, 59)}, 1e-3, 1e-4);
}

TEST(LayerNorm, ErrorsNameOpShapesAndDtypes) {
  const Tensor x = Tensor::zeros({4, 8});
  expect_error([&] { layer_norm(x, Tensor::ones({7}), Tensor(), 1e-5); },
               {"layer_norm", "weight", "f32[7]", "f32[4, 8]"});
  expect_error([&] { layer_norm(x, Tensor(), Tensor::zeros({8}, DType::f64), 1e-5); },
               {"layer_norm", "bias", "f64[8]"});
  expect_error(
      [&] {
        layer_norm(Tensor::zeros({4, 8}, DType::i32), Tensor(), Tensor(), 1e-5);
      },
      {"layer_norm", "i32[4, 8]"});
  expect_error([&] { layer_norm(x, Tensor(), Tensor(), -1.0); }, {"layer_norm", "eps"});
}

// The fused residual gives the unfused pair's bits, forward and backward, and
// names a residual that does not match.
TEST(LayerNorm, AddLayerNormIsLayerNormOfTheSumBitForBit) {
  for (DType t : {DType::f32, DType::f64}) {
    const Tensor x = random({6, 40}, 61).to(t).set_requires_grad(true);
    const Tensor r = random({6, 40}, 62).to(t).set_requires_grad(true);
    const Tensor w = random({40}, 63).to(t).set_requires_grad(true);
    const Tensor b = random({40}, 64).to(t).set_requires_grad(true);
    const Tensor g = random({6, 40}, 65).to(t);
    const Tensor fused = add_layer_norm(x, r, w, b, 1e-12);
    sum(mul(fused, g)).backward();
    const std::vector<double> fx = x.grad().to_vector<double>(), fr = r.grad().to_vector<double>(),
                              fw = w.grad().to_vector<double>(), fb = b.grad().to_vector<double>();
    x.zero_grad(), r.zero_grad(), w.zero_grad(), b.zero_grad();
    const Tensor plain = layer_norm(add(x, r), w, b, 1e-12);
    sum(mul(plain, g)).backward();
    EXPECT_EQ(fused.to_vector<double>(), plain.to_vector<double>());
    EXPECT_EQ(fx, x.grad().to_vector<double>());
    EXPECT_EQ(fr, r.grad().to_vector<double>());
    EXPECT_EQ(fw, w.grad().to_vector<double>());
    EXPECT_EQ(fb, b.grad().to_vector<double>());
  }
  const Tensor x = Tensor::zeros({4, 8});
  expect_error(
      [&] {
        add_layer_norm(x, Tensor::zeros({4, 7}), Tensor(), Tensor(), 1e-5);
      },
      {"add_layer_norm", "residual", "f32[4, 7]", "f32[4, 8]"});
  expect_error([&] { add_layer_norm(x, Tensor(), Tensor(), Tensor(), 1e-5); },
               {"add_layer_norm", "residual is undefined"});
}

TEST(LayerNorm, SavedInputModifiedInPlaceIsAnError) {
  Tensor x = random({2, 8}, 55).set_requires_grad(true);
  Tensor w = random({8}, 56).set_requires_grad(true);
  Tensor y = layer_norm(x, w, Tensor(), 1e-5);
  w.detach().fill_(2.0);  // e.g. an optimizer step between forward and backward
  EXPECT_THROW(sum(y).backward(), Error);
}

// --- gelu -----------------------------------------------------------------------

TEST(Gelu, ForwardMatchesErfFormIncludingViews) {
  for (DType dtype : {DType::f32, DType::f64}) {
    const Tensor x = random({9, 13}, 60, dtype, -5.0, 5.0);
    std::vector<double> want = x.to_vector<double>();
    for (double& v : want) v = ref_gelu(v);
    EXPECT_TRUE(all_close(gelu(x), from_doubles(want, {9, 13}), 1e-5, 1e-6));
    EXPECT_TRUE(all_close(gelu(transposed_copy(x)), from_doubles(want, {9, 13}), 1e-5, 1e-6));
  }
  // The erf form, not the tanh approximation: they differ by ~1e-4 at x = 1.5.
  EXPECT_NEAR(gelu(Tensor::full({1}, 1.5, DType::f32)).item(), ref_gelu(1.5), 1e-6);
  const Tensor xb = random({64}, 61, DType::bf16, -3, 3);
  std::vector<double> wb = xb.to_vector<double>();
  for (double& v : wb) v = ref_gelu(v);
  EXPECT_TRUE(all_close(gelu(xb), from_doubles(wb, {64}), 1e-2, 1e-2));
}

TEST(Gelu, GradcheckF64) {
  EXPECT_TRUE(
      gradcheck([](const auto& in) { return gelu(in[0]); }, {random_f64({4, 5}, 70, -4, 4)}));
}

// The tanh GELU of the fused feed-forward block, written out with the
// elementwise ops: x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
Tensor ref_gelu_tanh(const Tensor& x) {
  const Tensor u = mul(add(x, mul(pow(x, 3.0), 0.044715)), std::sqrt(2.0 / M_PI));
  return mul(mul(x, 0.5), add(tanh(u), 1.0));
}

TEST(GeluTanhFfn, ForwardIsTheTwoProductsAroundTheTanhGelu) {
  const Tensor x = random_f64({2, 3, 4}, 72, -3, 3), w1 = random_f64({8, 4}, 73);
  const Tensor b1 = random_f64({8}, 74), w2 = random_f64({5, 8}, 75), b2 = random_f64({5}, 76);
  const Tensor want = linear(ref_gelu_tanh(linear(x, w1, b1)), w2, b2);
  const Tensor got = gelu_tanh_ffn(x, w1, b1, w2, b2);
  EXPECT_EQ(got.shape(), (Shape{2, 3, 5}));
  EXPECT_TRUE(all_close(got, want, 1e-12, 1e-12));
  // Not the erf GELU: the two differ visibly at this scale.
  const Tensor erf_form = linear(gelu(linear(x, w1, b1)), w2, b2);
  EXPECT_FALSE(all_close(got, erf_form, 1e-6, 1e-6));
  EXPECT_THROW(gelu_tanh_ffn(x, w1, b1, w2.transpose(0, 1), b2), Error);
}

TEST(GeluTanhFfn, GradcheckF64) {
  EXPECT_TRUE(
      gradcheck([](const auto& in) { return gelu_tanh_ffn(in[0], in[1], in[2], in[3], in[4]); },
                {random_f64({3, 4}, 77, -3, 3), random_f64({6, 4}, 78), random_f64({6}, 79),
                 random_f64({5, 6}, 80), random_f64({5}, 81)}));
}

TEST(Gelu, OnednnBackwardMatchesF64Loop) {
  expect_f32_backward_matches_f64([](const auto& in) { return gelu(in[0]); },
                                  {random_f64({1000}, 71, -6, 6)});
}

TEST(Gelu, ErrorsNameOpAndTensor) {
  expect_error([] { gelu(Tensor::zeros({3}, DType::i32)); }, {"gelu", "i32[3]"});
}

// --- dropout --------------------------------------------------------------------

TEST(Dropout, KeepRateAndScaling) {
  const int64_t n = 1000000;
  for (double p : {0.1, 0.5}) {
    DropoutContext ctx{123, 0, 0};
    const auto y = dropout(Tensor::ones({n}), p, true, ctx).to_vector<float>();
    const float scale = float(1.0 / (1.0 - p));
    int64_t kept = 0;
    for (float v : y) {
      if (v != 0.0f) {
        ++kept;
        EXPECT_EQ(v, scale);
      }
    }
    EXPECT_NEAR(double(kept) / double(n), 1.0 - p, 0.005) << p;
    EXPECT_EQ(ctx.next_site, 1u);  // one site taken
  }
}

// The shared rule of core/philox.h, written out element by element: feature
// f is the 16-bit half f % 2 of word (f % 8) / 2 of counter block f / 8.
bool reference_keep(uint64_t seed, uint64_t step, uint32_t site, int64_t sequence, int64_t position,
                    int64_t feature, double p) {
  const PhiloxCounter bits = philox4x32(
      dropout_block(uint32_t(feature / 8), uint32_t(position), uint32_t(sequence), site, 0),
      dropout_key(seed, step));
  const uint32_t word = bits[int(feature % 8 / 2)];
  const uint32_t draw = feature % 2 ? word >> 16 : word & 0xFFFFu;
  return draw >= uint32_t(std::ceil(p * 65536.0));
}

TEST(Dropout, MaskFollowsTheSharedRule) {
  // 70 features: less than one call of the CPU's 128 draws; 261: three calls
  // and a part-block tail.
  for (const int64_t F : {70, 261}) {
    const int64_t B = 3, S = 5;
    const Tensor x = random({B, S, F}, 80, DType::f32, 0.5, 1.5);
    DropoutContext ctx{5, 9, 11, 2};
    const auto got = dropout(x, 0.3, true, ctx).to_vector<float>();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < S; ++s)
        for (int64_t f = 0; f < F; ++f)
          ASSERT_EQ(got[size_t((b * S + s) * F + f)] != 0.0f,
                    reference_keep(5, 9, 2, 11 + b, s, f, 0.3))
              << b << " " << s << " " << f;
    EXPECT_EQ(ctx.next_site, 3u);
  }
}

TEST(Dropout, MaskIsKeyedBySequenceNotByTheBatchSplit) {
  const Tensor x = random({4, 6, 33}, 81, DType::f32, 0.5, 1.5);
  auto run = [&](const Tensor& in, uint64_t seed, uint64_t step, int64_t first) {
    DropoutContext ctx{seed, step, first};
    return dropout(in, 0.3, true, ctx).to_vector<float>();
  };
  const auto whole = run(x, 5, 0, 0);
  // Two micro-batches of two sequences each draw exactly the same masks.
  auto halves = run(x.narrow(0, 0, 2).contiguous(), 5, 0, 0);
  const auto second = run(x.narrow(0, 2, 2).contiguous(), 5, 0, 2);
  halves.insert(halves.end(), second.begin(), second.end());
  EXPECT_EQ(halves, whole);
  // A shorter (unpadded) sequence keeps the draws of its positions.
  const auto shorter = run(x.narrow(1, 0, 4).contiguous(), 5, 0, 0);
  for (int64_t b = 0; b < 4; ++b)
    for (int64_t s = 0; s < 4; ++s)
      for (int64_t f = 0; f < 33; ++f)
        ASSERT_EQ(shorter[size_t((b * 4 + s) * 33 + f)], whole[size_t((b * 6 + s) * 33 + f)]);
  EXPECT_NE(run(x, 5, 1, 0), whole);  // another step
  EXPECT_NE(run(x, 6, 0, 0), whole);  // another seed
  // Independent of the thread count, and of the input's strides.
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto one = run(x, 5, 0, 0);
  omp_set_num_threads(threads);
  EXPECT_EQ(one, whole);
  EXPECT_EQ(run(x.transpose(0, 1).contiguous().transpose(0, 1), 5, 0, 0), whole);
}

TEST(Dropout, BackwardAppliesTheForwardMask) {
  Tensor x = random({64, 33}, 90, DType::f32, 0.5, 1.5).set_requires_grad(true);
  DropoutContext ctx{9, 40, 0};
  const Tensor y = dropout(x, 0.25, true, ctx);
  const Tensor g = random({64, 33}, 91);
  y.backward(g);
  const auto yv = y.to_vector<float>(), xv = x.to_vector<float>();
  const auto gv = g.to_vector<float>(), dx = x.grad().to_vector<float>();
  const float scale = float(1.0 / 0.75);
  int64_t dropped = 0;
  for (size_t i = 0; i < yv.size(); ++i) {
    if (yv[i] == 0.0f) {
      ++dropped;
      EXPECT_EQ(dx[i], 0.0f);
    } else {
      EXPECT_FLOAT_EQ(yv[i], xv[i] * scale);
      EXPECT_FLOAT_EQ(dx[i], gv[i] * scale);
    }
  }
  EXPECT_GT(dropped, 0);
  // Gradient check with a fixed context per call, so every evaluation draws
  // the same mask.
  EXPECT_TRUE(gradcheck(
      [](const auto& in) {
        DropoutContext fixed{3, 8, 0};
        return dropout(in[0], 0.4, true, fixed);
      },
      {random_f64({6, 7}, 92)}));
}

TEST(Dropout, IdentityInEvalAndForZeroP) {
  Tensor x = random({4, 5}, 100).set_requires_grad(true);
  DropoutContext ctx{1, 16, 0};
  for (const Tensor& y : {dropout(x, 0.5, false, ctx), dropout(x, 0.0, true, ctx)}) {
    EXPECT_TRUE(y.shares_storage_with(x));
    EXPECT_EQ(y.grad_fn(), nullptr);
    EXPECT_EQ(y.to_vector<float>(), x.to_vector<float>());
  }
  EXPECT_EQ(ctx.next_site, 0u);  // no site taken
}

TEST(Dropout, ErrorsNameOpAndP) {
  DropoutContext gen{1, 0, 0};
  const Tensor x = Tensor::ones({3});
  expect_error([&] { dropout(x, 1.0, true, gen); }, {"dropout", "[0, 1)", "1", "f32[3]"});
  expect_error([&] { dropout(x, -0.1, false, gen); }, {"dropout", "-0.1"});
  expect_error([&] { dropout(Tensor::ones({3}, DType::i64), 0.1, true, gen); },
               {"dropout", "i64[3]"});
}

// --- dropout_add_layer_norm ---------------------------------------------------------
// add_layer_norm(dropout(x), residual) bit for bit, forward and every
// gradient, with the same site taken; the fused forward and backward call no
// dropout kernel (the 4-D input, whose rows are not tokens, runs the pair).
struct DropoutLayerNormCase {
  const char* what;
  Shape shape;
  DType x_dtype, residual_dtype;
  bool stream = false;  // [T, F] with tokens
  bool fused = true;    // the kernels apply the mask (false: the pair runs)
};

TEST(DropoutAddLayerNorm, IsDropoutThenAddLayerNormBitForBit) {
  const std::vector<DropoutLayerNormCase> cases = {
      {"padded [B, S, F]", {3, 5, 24}, DType::f32, DType::f32},
      {"[B, F], f64", {4, 24}, DType::f64, DType::f64},
      {"token stream", {7, 24}, DType::f32, DType::f32, true},
      {"bf16 x on an f32 residual", {3, 5, 24}, DType::bf16, DType::f32},
      {"bf16 token stream on f32", {7, 24}, DType::bf16, DType::f32, true},
      {"bf16 throughout", {6, 16}, DType::bf16, DType::bf16},
      {"a vector: one row", {40}, DType::f32, DType::f32},
      {"4-D: rows are not tokens", {2, 3, 2, 8}, DType::f32, DType::f32, false, false},
  };
  const Tensor tokens =
      Tensor::from_vector<int64_t>({0, 0, 0, 1, 2, 0, 1, 1, 0, 2, 2, 1, 1, 0}, {7, 2});
  const auto dropout_calls = [] {
    using kernels::KernelId;
    return kernels::kernel_calls_by_id[size_t(KernelId::dropout)] +
           kernels::kernel_calls_by_id[size_t(KernelId::dropout_tokens)];
  };
  for (const DropoutLayerNormCase& c : cases) {
    for (const bool switched_on : {true, false}) {
      SCOPED_TRACE(std::string(c.what) + (switched_on ? "" : ", fusion switched off"));
      const FusedResidualDropoutScope scope(switched_on);
      const int64_t cols = c.shape.back();
      const Tensor x = random(c.shape, 70).to(c.x_dtype).set_requires_grad(true);
      const Tensor r = random(c.shape, 71).to(c.residual_dtype).set_requires_grad(true);
      const Tensor w = random({cols}, 72).to(c.residual_dtype).set_requires_grad(true);
      const Tensor b = random({cols}, 73).to(c.residual_dtype).set_requires_grad(true);
      const Tensor g = random(c.shape, 74).to(c.residual_dtype);
      const auto grads = [&] {
        std::vector<std::vector<double>> v;
        for (const Tensor* t : {&x, &r, &w, &b}) {
          v.push_back(t->grad().to(DType::f64).to_vector<double>());
          const_cast<Tensor*>(t)->zero_grad();
        }
        return v;
      };
      DropoutContext fused_ctx{5, 3, 2, 4};
      const uint64_t calls_before = dropout_calls();
      const Tensor fused =
          c.stream ? dropout_add_layer_norm(x, r, w, b, 1e-5, 0.3, true, fused_ctx, tokens)
                   : dropout_add_layer_norm(x, r, w, b, 1e-5, 0.3, true, fused_ctx);
      sum(mul(fused, g)).backward();
      const uint64_t fused_calls = dropout_calls() - calls_before;
      const auto fused_grads = grads();
      DropoutContext pair_ctx{5, 3, 2, 4};
      const Tensor dropped =
          c.stream ? dropout(x, 0.3, true, pair_ctx, tokens) : dropout(x, 0.3, true, pair_ctx);
      const Tensor pair = add_layer_norm(dropped, r, w, b, 1e-5);
      sum(mul(pair, g)).backward();
      EXPECT_EQ(fused.to(DType::f64).to_vector<double>(), pair.to(DType::f64).to_vector<double>());
      EXPECT_EQ(fused_grads, grads());
      EXPECT_EQ(fused_ctx.next_site, pair_ctx.next_site);
      EXPECT_EQ(fused_calls, c.fused && switched_on ? 0u : 2u) << "dropout kernel calls";
      // Some elements were dropped (zero gradient), not all.
      const auto zeros = std::count(fused_grads[0].begin(), fused_grads[0].end(), 0.0);
      EXPECT_GT(zeros, 0);
      EXPECT_LT(zeros, int64_t(fused_grads[0].size()) / 2);
    }
  }
}

// No rows ([B, 0, F]): an empty result, and the site taken as dropout takes it.
TEST(DropoutAddLayerNorm, EmptyInputsGiveEmptyResultsAndTakeTheirSite) {
  for (const Shape& shape : {Shape{2, 0, 8}, Shape{0, 8}}) {
    DropoutContext ctx{1, 2, 0};
    const Tensor x = Tensor::zeros(shape), r = Tensor::zeros(shape);
    const Tensor y = dropout_add_layer_norm(x, r, Tensor(), Tensor(), 1e-5, 0.2, true, ctx);
    EXPECT_EQ(y.shape(), shape);
    EXPECT_EQ(ctx.next_site, 1u);
  }
}

TEST(DropoutAddLayerNorm, WithoutDropoutIsAddLayerNormAndTakesNoSite) {
  const Tensor x = random({4, 16}, 80), r = random({4, 16}, 81);
  const std::vector<float> want = add_layer_norm(x, r, Tensor(), Tensor(), 1e-5).to_vector<float>();
  DropoutContext ctx{1, 2, 0};
  EXPECT_EQ(
      dropout_add_layer_norm(x, r, Tensor(), Tensor(), 1e-5, 0.4, false, ctx).to_vector<float>(),
      want);
  EXPECT_EQ(
      dropout_add_layer_norm(x, r, Tensor(), Tensor(), 1e-5, 0.0, true, ctx).to_vector<float>(),
      want);
  EXPECT_EQ(ctx.next_site, 0u);
}

TEST(DropoutAddLayerNorm, ErrorsNameTheOpAndTheValue) {
  DropoutContext ctx{1, 0, 0};
  const Tensor x = Tensor::zeros({4, 8});
  expect_error(
      [&] { dropout_add_layer_norm(x, Tensor(), Tensor(), Tensor(), 1e-5, 0.1, true, ctx); },
      {"dropout_add_layer_norm", "residual is undefined", "f32[4, 8]"});
  expect_error([&] { dropout_add_layer_norm(x, x, Tensor(), Tensor(), 1e-5, 1.0, true, ctx); },
               {"dropout_add_layer_norm", "[0, 1)", "1"});
  expect_error(
      [&] {
        dropout_add_layer_norm(x, x, Tensor(), Tensor(), 1e-5, 0.1, true, ctx,
                               Tensor::zeros({3, 2}, DType::i64));
      },
      {"dropout_add_layer_norm", "tokens", "i64[3, 2]", "f32[4, 8]"});
  expect_error(
      [&] {
        dropout_add_layer_norm(x, Tensor::zeros({4, 7}), Tensor(), Tensor(), 1e-5, 0.1, true, ctx);
      },
      {"dropout_add_layer_norm", "residual", "f32[4, 7]"});
}

// --- embedding ------------------------------------------------------------------

TEST(Embedding, ForwardGathersRowsForAnyIdShapeAndLayout) {
  const Tensor w = random({10, 6}, 110);
  const auto wv = w.to_vector<float>();
  const std::vector<int64_t> ids = {3, 0, 9, 3, 3, 7};
  auto check = [&](const Tensor& weight, const Tensor& id) {
    const Tensor out = embedding(weight, id);
    EXPECT_EQ(out.shape(), (Shape{2, 3, 6}));
    const auto ov = out.to_vector<float>();
    const auto iv = id.to_vector<int64_t>();
    for (size_t n = 0; n < iv.size(); ++n)
      for (size_t c = 0; c < 6; ++c) EXPECT_EQ(ov[n * 6 + c], wv[iv[n] * 6 + c]);
  };
  check(w, Tensor::from_vector<int64_t>(ids, {2, 3}));
  check(w, Tensor::from_vector<int64_t>(ids, {2, 3}).to(DType::i32));
  check(transposed_copy(w), Tensor::from_vector<int64_t>(ids, {3, 2}).transpose(0, 1));
  EXPECT_EQ(embedding(w, Tensor::zeros({0}, DType::i64)).shape(), (Shape{0, 6}));
}

TEST(Embedding, RepeatedIdsAccumulate) {
  Tensor w = random({5, 3}, 120).set_requires_grad(true);
  const Tensor ids = Tensor::from_vector<int32_t>({1, 4, 1, 1, 0}, {5});
  const Tensor g = random({5, 3}, 121, DType::f64);
  embedding(w, ids).backward(g.to(DType::f32));
  std::vector<double> want(15, 0.0);
  const auto gv = g.to_vector<double>();
  const std::vector<int> iv = {1, 4, 1, 1, 0};
  for (size_t n = 0; n < 5; ++n)
    for (size_t c = 0; c < 3; ++c) want[iv[n] * 3 + c] += gv[n * 3 + c];
  EXPECT_TRUE(all_close(w.grad(), from_doubles(want, {5, 3}), 1e-6, 1e-6));
  // Rows no id names get exactly zero.
  for (size_t c = 0; c < 3; ++c) {
    EXPECT_EQ(w.grad().to_vector<float>()[2 * 3 + c], 0.0f);
    EXPECT_EQ(w.grad().to_vector<float>()[3 * 3 + c], 0.0f);
  }
}

TEST(Embedding, GradcheckF64) {
  const Tensor ids = Tensor::from_vector<int64_t>({2, 0, 2, 3, 2, 1}, {3, 2});
  EXPECT_TRUE(
      gradcheck([&](const auto& in) { return embedding(in[0], ids); }, {random_f64({4, 5}, 130)}));
  expect_f32_backward_matches_f64([&](const auto& in) { return embedding(in[0], ids); },
                                  {random_f64({4, 5}, 131)}, 1e-6, 1e-6);
}

TEST(Embedding, BackwardIsBitwiseDeterministic) {
  const int64_t vocab = 97, dim = 200, n = 6000;
  Generator gen{7, 0};
  std::vector<int64_t> idv(n);
  const auto u = Tensor::rand({n}, gen, DType::f64).to_vector<double>();
  for (int64_t i = 0; i < n; ++i) idv[i] = int64_t(u[i] * u[i] * vocab);  // skewed, many repeats
  const Tensor ids = Tensor::from_vector<int64_t>(idv, {60, 100});
  const Tensor g = random({60, 100, dim}, 141, DType::f32, -1, 1);
  auto run = [&] {
    Tensor w = random({vocab, dim}, 140).set_requires_grad(true);
    embedding(w, ids).backward(g);
    return w.grad().to_vector<float>();
  };
  const auto first = run();
  EXPECT_EQ(first, run());
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto serial = run();
  omp_set_num_threads(threads);
  EXPECT_EQ(first, serial);
}

TEST(Embedding, ErrorsNameIdPositionAndVocab) {
  const Tensor w = Tensor::zeros({10, 4});
  // Ids are checked by the kernel; the error is raised at the next sync point
  // (item, to_vector or check_kernel_errors), with the same message.
  expect_error(
      [&] {
        embedding(w, Tensor::from_vector<int64_t>({1, 2, 3, 12}, {2, 2}));
        check_kernel_errors();
      },
      {"embedding", "id 12", "position [1, 1]", "vocabulary size 10", "f32[10, 4]"});
  expect_error(
      [&] {
        const Tensor out = embedding(w, Tensor::from_vector<int32_t>({-1, 40}, {2}));
        sum(out).item();
      },
      {"embedding", "id -1", "position [0]"});
  EXPECT_NO_THROW(check_kernel_errors());  // taken once
  expect_error([&] { embedding(w, Tensor::zeros({3}, DType::f32)); },
               {"embedding", "i32 or i64", "f32[3]"});
  expect_error([&] { embedding(Tensor::zeros({10}), Tensor::zeros({3}, DType::i64)); },
               {"embedding", "[V, D]", "f32[10]"});
}

// --- cross_entropy --------------------------------------------------------------

TEST(CrossEntropy, MatchesLogSoftmaxGatherAndReferenceLoop) {
  const int64_t rows = 8, cols = 37;
  const Tensor x = random({rows, cols}, 150, DType::f32, -5, 5);
  const std::vector<int64_t> tv = {0, 36, 5, 5, 17, 2, 30, 11};
  const double want = ref_cross_entropy(x.to_vector<double>(), tv, cols, -100);
  // The composite: -mean(log_softmax(x)[n, t[n]]).
  const auto ls = log_softmax(x).to_vector<double>();
  double gathered = 0;
  for (int64_t r = 0; r < rows; ++r) gathered -= ls[r * cols + tv[r]] / double(rows);
  for (DType tdt : {DType::i64, DType::i32}) {
    const Tensor t = Tensor::from_vector<int64_t>(tv, {rows}).to(tdt);
    const Tensor loss = cross_entropy(x, t);
    EXPECT_EQ(loss.dim(), 0);
    EXPECT_EQ(loss.dtype(), DType::f32);
    EXPECT_NEAR(loss.item(), want, 1e-5 * want);
    EXPECT_NEAR(loss.item(), gathered, 1e-5 * want);
    EXPECT_NEAR(cross_entropy(transposed_copy(x), t).item(), want, 1e-5 * want);
    EXPECT_NEAR(cross_entropy(x.to(DType::f64), t).item(), want, 1e-12);
  }
  const Tensor tb = Tensor::from_vector<int64_t>(tv, {rows});
  EXPECT_NEAR(cross_entropy(x.to(DType::bf16), tb).item(),
              ref_cross_entropy(x.to(DType::bf16).to_vector<double>(), tv, cols, -100),
              2e-2);  // the loss itself is rounded to bf16 (8 bits)
}

TEST(CrossEntropy, IgnoredRowsContributeNothing) {
  const int64_t cols = 11;
  Tensor x = random({6, cols}, 160, DType::f32, -3, 3).set_requires_grad(true);
  const Tensor t = Tensor::from_vector<int64_t>({4, -100, 10, -100, 0, 7}, {6});
  const Tensor loss = cross_entropy(x, t);
  // Same as the loss over the four counted rows alone.
  const Tensor kept = index_select(x.detach(), Tensor::from_vector<int64_t>({0, 2, 4, 5}, {4}));
  EXPECT_NEAR(loss.item(),
              cross_entropy(kept, Tensor::from_vector<int64_t>({4, 10, 0, 7}, {4})).item(), 1e-6);
  loss.backward();
  const auto gx = x.grad().to_vector<float>();
  for (int64_t r : {1, 3})
    for (int64_t c = 0; c < cols; ++c) EXPECT_EQ(gx[r * cols + c], 0.0f);
  // Counted rows: (softmax - onehot) / 4 sums to zero per row.
  for (int64_t r : {0, 2, 4, 5}) {
    double s = 0;
    for (int64_t c = 0; c < cols; ++c) s += gx[r * cols + c];
    EXPECT_NEAR(s, 0.0, 1e-6);
  }
  // Another ignore_index value.
  const Tensor t2 = Tensor::from_vector<int64_t>({4, 3, 10, 3, 0, 7}, {6});
  EXPECT_NEAR(cross_entropy(x.detach(), t2, 3).item(), loss.item(), 1e-6);
}

TEST(CrossEntropy, AllIgnoredGivesZeroLossAndZeroGradient) {
  Tensor x = random({3, 5}, 170).set_requires_grad(true);
  const Tensor loss = cross_entropy(x, Tensor::full({3}, -100, DType::i64));
  EXPECT_EQ(loss.item(), 0.0);
  loss.backward();
  for (float v : x.grad().to_vector<float>()) EXPECT_EQ(v, 0.0f);
  EXPECT_EQ(cross_entropy(Tensor::zeros({0, 5}), Tensor::zeros({0}, DType::i64)).item(), 0.0);
}

TEST(CrossEntropy, GradcheckF64) {
  const Tensor t = Tensor::from_vector<int64_t>({2, -100, 0, 4}, {4});
  EXPECT_TRUE(gradcheck([&](const auto& in) { return cross_entropy(in[0], t); },
                        {random_f64({4, 5}, 180, -2, 2)}));
  EXPECT_TRUE(
      gradcheck([&](const auto& in) { return mul(cross_entropy(in[0].transpose(0, 1), t), 3.0); },
                {random_f64({5, 4}, 181, -2, 2)}));
}

TEST(CrossEntropy, F32BackwardMatchesF64AtBertVocabSize) {
  // C = 30522 runs several chunks of the one-pass kernel per row.
  const int64_t rows = 6, cols = 30522;
  const Tensor t = Tensor::from_vector<int64_t>({0, 30521, -100, 1234, 20000, 7}, {rows});
  const Tensor x64 = random_f64({rows, cols}, 190, -8, 8);
  Tensor x32 = x64.to(DType::f32).detach().clone().set_requires_grad(true);
  Tensor xd = x32.detach().to(DType::f64).clone().set_requires_grad(true);
  const Tensor l32 = cross_entropy(x32, t), l64 = cross_entropy(xd, t);
  EXPECT_NEAR(l32.item(), l64.item(), 1e-5 * l64.item());
  l32.backward();
  l64.backward();
  EXPECT_TRUE(all_close(x32.grad(), xd.grad(), 1e-5, 1e-9));
}

TEST(CrossEntropy, LossIsF32ForBf16LogitsAndF64ForF64) {
  const Tensor t = Tensor::from_vector<int64_t>({1, 0, 2}, {3});
  const Tensor x = random({3, 4}, 160, DType::f64, -2, 2);
  const Tensor l64 = cross_entropy(x, t);
  EXPECT_EQ(l64.dtype(), DType::f64);
  EXPECT_EQ(cross_entropy(x.to(DType::f32), t).dtype(), DType::f32);
  const Tensor lbf = cross_entropy(x.to(DType::bf16), t);
  EXPECT_EQ(lbf.dtype(), DType::f32);
  // Not rounded to bf16's 8 bits: within bf16 input rounding of the f64 loss.
  EXPECT_NEAR(lbf.item(), l64.item(), 2e-2);
  EXPECT_NE(lbf.item(), double(float(bf16(float(lbf.item())))));
}

TEST(CrossEntropy, ErrorsNameRowValueAndShapes) {
  const Tensor x = Tensor::zeros({3, 4});
  // Targets are checked by the kernel; the error comes with the loss's item().
  expect_error(
      [&] {
        cross_entropy(x, Tensor::from_vector<int64_t>({0, 4, 1}, {3})).item();
      },
      {"cross_entropy", "target 4", "row 1", "4 classes", "f32[3, 4]"});
  expect_error(
      [&] {
        cross_entropy(x, Tensor::from_vector<int64_t>({0, 1, -2}, {3})).item();
      },
      {"cross_entropy", "target -2", "row 2"});
  EXPECT_NO_THROW(check_kernel_errors());
  expect_error([&] { cross_entropy(x, Tensor::zeros({2}, DType::i64)); },
               {"cross_entropy", "i64[2]", "f32[3, 4]"});
  expect_error([&] { cross_entropy(x, Tensor::zeros({3}, DType::f32)); },
               {"cross_entropy", "i32 or i64", "f32[3]"});
  expect_error(
      [&] {
        cross_entropy(Tensor::zeros({2, 3, 4}), Tensor::zeros({2}, DType::i64));
      },
      {"cross_entropy", "[N, C]", "f32[2, 3, 4]"});
}

// --- bf16 ---------------------------------------------------------------------

TEST(NnOpsBf16, BackwardIsCloseToF64) {
  // bf16 keeps 8 mantissa bits: gradients agree to about 1e-2.
  const double tol = 3e-2;
  expect_f32_backward_matches_f64([](const auto& in) { return softmax(in[0]); },
                                  {random_f64({4, 50}, 200, -2, 2)}, tol, tol, DType::bf16);
  expect_f32_backward_matches_f64([](const auto& in) { return log_softmax(in[0]); },
                                  {random_f64({4, 50}, 201, -2, 2)}, tol, tol, DType::bf16);
  expect_f32_backward_matches_f64(
      [](const auto& in) { return layer_norm(in[0], in[1], in[2], 1e-5); },
      {random_f64({6, 32}, 202, -2, 2), random_f64({32}, 203, 0.5, 1.5), random_f64({32}, 204)},
      tol, 0.1, DType::bf16);
  expect_f32_backward_matches_f64([](const auto& in) { return gelu(in[0]); },
                                  {random_f64({300}, 205, -4, 4)}, tol, tol, DType::bf16);
  const Tensor t = Tensor::from_vector<int64_t>({1, -100, 40, 7}, {4});
  expect_f32_backward_matches_f64([&](const auto& in) { return cross_entropy(in[0], t); },
                                  {random_f64({4, 50}, 206, -3, 3)}, tol, 1e-3, DType::bf16);
}

}  // namespace
}  // namespace roformer
