// The kernel layer under the ops: exceptions out of OpenMP regions, the
// bounded oneDNN primitive cache, overlap-safe copies, size inference in
// view/reshape, the device error record behind index checks, and the
// kernel call counters.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/cpu/onednn.h"
#include "core/cpu/philox_simd.h"
#include "core/cpu/strided_loop.h"
#include "core/kernels/coalesce_dims.h"
#include "core/kernels/fast_divmod.h"
#include "core/ops.h"
#include "core/ops/dispatch.h"
#include "core/philox.h"
#include "tests/core/gradcheck.h"
#include "tests/test_support.h"

namespace roformer {
namespace {

using testing::error_of;

#define EXPECT_MENTIONS(msg, text) \
  EXPECT_NE((msg).find(text), std::string::npos) << "'" << (text) << "' missing from: " << (msg)

TEST(KernelRegions, AnExceptionInsideAParallelLoopReachesTheCaller) {
  // Enough work to take the OpenMP path.
  const std::string msg = error_of([] {
    kernels::cpu::parallel_rows(1 << 16, 1, [](int64_t i) {
      if (i == 40000) throw Error("row 40000 failed");
    });
  });
  EXPECT_MENTIONS(msg, "row 40000 failed");
}

TEST(KernelRegions, AttentionKernelErrorInsideItsRegionIsThrownNotTerminate) {
  // f64 attention with dropout reads its keep bits inside the parallel
  // region over (batch, head); keep bits of the wrong dtype make that read
  // throw there.
  const int64_t B = 2, H = 2, S = 8, D = 4;
  const Tensor q = Tensor::ones({B, H, S, D}, DType::f64);
  const Tensor out = Tensor::empty({B, H, S, D}, DType::f64);
  const Tensor lse = Tensor::empty({B, H, S}, DType::f64);
  const Tensor bad_bits = Tensor::empty({B, H, S, 1}, DType::f32);
  kernels::AttentionParams params;
  params.dropout_p = 0.5;
  const std::string msg = error_of([&] {
    launch::attention_forward(Device::cpu(), params, q, q, q, Tensor(), out, lse, bad_bits);
  });
  EXPECT_MENTIONS(msg, "f32");
}

// Attention with no query rows or no keys: every output is written (they
// start as NaN) -- zeros, and lse -inf for a row with no key -- in each CPU
// path (oneDNN GEMMs for f32 and bf16, loops for f64); the CUDA kernels'
// edge cases pin the same (tests/cuda/test_flash_attention.cpp).
TEST(AttentionKernels, NoQueryRowsOrNoKeysWriteZeros) {
  const int64_t B = 2, H = 2, D = 8;
  for (const DType dtype : {DType::f32, DType::bf16, DType::f64})
    for (const auto& [Sq, Sk] : {std::pair<int64_t, int64_t>{0, 5}, {4, 0}}) {
      const DType result = dtype == DType::f64 ? DType::f64 : DType::f32;
      auto in = [&](int64_t S) { return Tensor::ones({B, H, S, D}, dtype); };
      auto nan = [&](const Shape& shape) { return Tensor::full(shape, NAN, result); };
      const Tensor q = in(Sq), k = in(Sk), v = in(Sk), grad_out = in(Sq);
      const Tensor out = nan({B, H, Sq, D}), lse = nan({B, H, Sq});
      const Tensor dq = nan({B, H, Sq, D}), dk = nan({B, H, Sk, D}), dv = nan({B, H, Sk, D});
      kernels::AttentionParams params;
      params.scale = 0.5;
      launch::attention_forward(Device::cpu(), params, q, k, v, Tensor(), out, lse, Tensor());
      launch::attention_backward(Device::cpu(), params, q, k, v, Tensor(), out, lse, Tensor(),
                                 grad_out, dq, dk, dv);
      const std::string what = std::string(dtype_name(dtype)) + " Sq " + std::to_string(Sq) +
                               ", Sk " + std::to_string(Sk);
      for (const Tensor* t : {&out, &dq, &dk, &dv})
        for (double x : t->to(DType::f64).to_vector<double>()) ASSERT_EQ(x, 0.0) << what;
      for (double x : lse.to(DType::f64).to_vector<double>())
        ASSERT_TRUE(std::isinf(x) && x < 0) << what;
    }
}

TEST(PrimitiveCache, IsBoundedAndEvictsTheLeastRecentlyUsed) {
  using namespace kernels::cpu;
  const size_t saved = primitive_cache_capacity();
  set_primitive_cache_capacity(3);
  EXPECT_LE(primitive_cache_size(), 3u);
  const size_t evicted = primitive_cache_evictions();
  int built = 0;
  auto get = [&](int i) {
    return *cached_primitive<int>("test-entry|" + std::to_string(i), [&] {
      ++built;
      return i;
    });
  };
  for (int i = 0; i < 3; ++i) EXPECT_EQ(get(i), i);
  EXPECT_EQ(built, 3);
  get(0);  // 0 becomes the most recent; 1 is now the oldest
  EXPECT_EQ(built, 3);
  get(3);  // evicts 1
  EXPECT_EQ(primitive_cache_size(), 3u);
  EXPECT_GE(primitive_cache_evictions(), evicted + 1);
  get(0);
  get(2);
  EXPECT_EQ(built, 4);  // still cached
  get(1);
  EXPECT_EQ(built, 5);  // was evicted, built again
  // Real primitives keep working under a tiny bound.
  const Tensor a = Tensor::ones({3, 5}), b = Tensor::ones({5, 2});
  for (int64_t n = 1; n <= 6; ++n) {
    const Tensor r = matmul(a.narrow(0, 0, std::min<int64_t>(n, 3)), b);
    EXPECT_EQ(r.to_vector<float>()[0], 5.0f);
  }
  EXPECT_LE(primitive_cache_size(), 3u);
  set_primitive_cache_capacity(saved);
}

// Where oneDNN has no bf16 matmul (below AVX-512; forced here), a bf16
// product is the f32 product of the same values, rounded once into a bf16
// out: bit for bit what the f32 kernel gives on f32 copies of the operands
// in the same geometry, with a bias and when adding into out. Where oneDNN
// has one, the two agree to bf16's rounding.
TEST(Bf16Matmul, WithoutOneDnnBf16IsTheF32ProductOfTheBf16Values) {
  const bool native = kernels::cpu::onednn_has_bf16_matmul();
  Generator gen{23, 0};
  const Device cpu = Device::cpu();
  // b and out through transposed views: the copies take any strides.
  const Tensor a = Tensor::randn({2, 19, 24}, gen).to(DType::bf16);
  const Tensor b = Tensor::randn({2, 13, 24}, gen).to(DType::bf16).transpose(1, 2);
  const Tensor bias = Tensor::randn({13}, gen).to(DType::bf16);
  const Tensor before = Tensor::randn({2, 13, 19}, gen);
  const Tensor a32 = a.to(DType::f32), b32 = b.to(DType::f32).contiguous();
  const Tensor bias32 = bias.to(DType::f32);
  for (const DType out_dtype : {DType::f32, DType::bf16}) {
    for (const bool accumulate : {false, true}) {
      SCOPED_TRACE(std::string("into ") + dtype_name(out_dtype) + (accumulate ? ", adding" : ""));
      const Tensor start = before.to(out_dtype);
      // The f32 kernel on the widened values, rounded once.
      Tensor want = start.to(DType::f32).clone().transpose(1, 2);
      if (accumulate)
        launch::matmul_accumulate(cpu, a32, b32, want);
      else
        launch::matmul(cpu, a32, b32, bias32, want);
      Tensor got = start.clone().transpose(1, 2);
      {
        const kernels::cpu::Bf16MatmulDisabled f32_products;
        ASSERT_FALSE(kernels::cpu::onednn_has_bf16_matmul());
        if (accumulate)
          launch::matmul_accumulate(cpu, a, b, got);
        else
          launch::matmul(cpu, a, b, bias, got);
      }
      EXPECT_EQ(got.to(DType::f64).to_vector<double>(),
                want.to(out_dtype).to(DType::f64).to_vector<double>());
      if (!native) continue;
      Tensor by_onednn = start.clone().transpose(1, 2);
      if (accumulate)
        launch::matmul_accumulate(cpu, a, b, by_onednn);
      else
        launch::matmul(cpu, a, b, bias, by_onednn);
      const double tolerance = out_dtype == DType::bf16 ? 1e-2 : 2e-6;
      EXPECT_TRUE(testing::all_close(got, by_onednn, tolerance, tolerance));
    }
  }
}

TEST(Copy, OverlappingStridedViewsCopyAsIfThroughATemporary) {
  // Rows of 10; shift every row right by one within the same storage.
  std::vector<double> values(20);
  for (size_t i = 0; i < values.size(); ++i) values[i] = double(i);
  const Tensor t = Tensor::from_vector(values, {2, 10});
  const Tensor src = t.narrow(1, 0, 9), dst = t.narrow(1, 1, 9);
  ASSERT_FALSE(src.is_contiguous());
  const Tensor dst_view = dst;
  Tensor(dst_view).copy_(src);
  const auto got = t.to_vector<double>();
  for (int64_t r = 0; r < 2; ++r) {
    EXPECT_EQ(got[size_t(r * 10)], double(r * 10));
    for (int64_t c = 1; c < 10; ++c)
      EXPECT_EQ(got[size_t(r * 10 + c)], double(r * 10 + c - 1)) << r << "," << c;
  }
  // Contiguous overlap (a shifted narrow of a flat tensor) too.
  const Tensor flat = Tensor::from_vector(values, {20});
  Tensor(flat.narrow(0, 2, 18)).copy_(flat.narrow(0, 0, 18));
  const auto f = flat.to_vector<double>();
  for (int64_t i = 2; i < 20; ++i) EXPECT_EQ(f[size_t(i)], double(i - 2));
}

// Bit patterns, so that -0 and 0 (or two NaNs) are told apart.
std::vector<uint32_t> f32_bits(const Tensor& t) {
  std::vector<uint32_t> bits(size_t(t.numel()));
  std::memcpy(bits.data(), t.data_as<float>(), bits.size() * sizeof(float));
  return bits;
}

struct LayerNormForward {
  Tensor y, sum, mean, var;
};

LayerNormForward layer_norm_forward_cpu(const Tensor& x, const Tensor& residual, const Tensor& w,
                                        const Tensor& b) {
  const int64_t rows = x.numel() / x.shape().back();
  LayerNormForward o{Tensor::full(x.shape(), NAN), Tensor::full(x.shape(), NAN),
                     Tensor::full({rows}, NAN), Tensor::full({rows}, NAN)};
  launch::layer_norm_forward(Device::cpu(), x, residual, w, b, 1e-5, kernels::ResidualDropout{},
                             Tensor(), o.y, Tensor(), o.sum, o.mean, o.var);
  return o;
}

// bf16 activations on an f32 residual stream: the kernel gives what casting
// x to f32 first gives, bit for bit (the cast is exact, the sum is f32's).
TEST(LayerNormKernel, Bf16InputWithAnF32ResidualIsTheF32KernelOnTheCastInput) {
  uint64_t seed = 1;
  for (const Shape& shape : {Shape{1, 8}, Shape{5, 13}, Shape{3, 4, 37}, Shape{70, 300}})
    for (const bool affine : {true, false}) {
      SCOPED_TRACE(Tensor::empty(shape).desc() + (affine ? " affine" : ""));
      Generator gen{seed++, 0};
      const int64_t cols = shape.back();
      const Tensor x = Tensor::randn(shape, gen).to(DType::bf16);
      const Tensor residual = mul(Tensor::randn(shape, gen), 3.0);
      const Tensor w = affine ? Tensor::randn({cols}, gen) : Tensor();
      const Tensor b = affine ? Tensor::randn({cols}, gen) : Tensor();
      const LayerNormForward got = layer_norm_forward_cpu(x, residual, w, b);
      const LayerNormForward want = layer_norm_forward_cpu(x.to(DType::f32), residual, w, b);
      EXPECT_EQ(f32_bits(got.sum), f32_bits(want.sum));
      EXPECT_EQ(f32_bits(got.y), f32_bits(want.y));
      EXPECT_EQ(f32_bits(got.mean), f32_bits(want.mean));
      EXPECT_EQ(f32_bits(got.var), f32_bits(want.var));
    }
}

// A residual dropout the kernel cannot place is an error naming what is
// missing: no residual, tokens of the wrong shape, rows that are not whole
// sequences of `positions`.
TEST(LayerNormKernel, ResidualDropoutNeedsAResidualAndWholeTokens) {
  const Tensor x = Tensor::ones({6, 8}), y = Tensor::empty({6, 8}), sum = Tensor::empty({6, 8});
  const Tensor stat = Tensor::empty({6});
  const kernels::ResidualDropout drop{0.2, DropoutKey{1, 0, 0, 0}, 3};
  const auto run = [&](const Tensor& residual, const kernels::ResidualDropout& d,
                       const Tensor& tokens) {
    return error_of([&] {
      launch::layer_norm_forward(Device::cpu(), x, residual, Tensor(), Tensor(), 1e-5, d, tokens, y,
                                 Tensor(), residual.defined() ? sum : Tensor(), stat, stat);
    });
  };
  EXPECT_MENTIONS(run(Tensor(), drop, Tensor()), "needs the residual");
  EXPECT_MENTIONS(run(x, kernels::ResidualDropout{0.2, DropoutKey{}, 4}, Tensor()),
                  "6 rows are not whole sequences of 4 positions");
  EXPECT_MENTIONS(run(x, kernels::ResidualDropout{0.2, DropoutKey{}, 0}, Tensor()),
                  "positions >= 1, got 0");
  EXPECT_MENTIONS(run(x, drop, Tensor::zeros({5, 2}, DType::i64)),
                  "tokens must be contiguous [6, 2] i64, got i64 with 2 dims, 10 elements");
  EXPECT_MENTIONS(run(x, kernels::ResidualDropout{1.0, DropoutKey{}, 1}, Tensor()),
                  "p in (0, 1), got 1");
}

TEST(LayerNormKernel, OtherDtypeMixesAreRejectedNamingTheDtypes) {
  const Tensor f32 = Tensor::ones({2, 8}), bf16 = f32.to(DType::bf16), f64 = f32.to(DType::f64);
  const Tensor w32 = Tensor::ones({8}), w16 = w32.to(DType::bf16), stat = Tensor::empty({2});
  struct Case {
    const char* what;
    Tensor x, residual, w, y, sum;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {"f32 x, bf16 residual", f32, bf16, w32, f32, f32, "x f32, residual bf16"},
      {"bf16 x, f64 residual", bf16, f64, Tensor(), f64, f64, "x bf16, residual f64"},
      {"bf16 x, f32 residual, bf16 weight", bf16, f32, w16, f32, f32, "weight bf16"},
      {"bf16 x, f32 residual, bf16 y", bf16, f32, w32, bf16, f32, "y bf16"},
      {"bf16 x, f32 residual, bf16 sum", bf16, f32, w32, f32, bf16, "sum bf16"},
      {"bf16 x, no residual, f32 y", bf16, Tensor(), w32, f32, Tensor(), "x bf16, residual none"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string msg = error_of([&] {
      launch::layer_norm_forward(Device::cpu(), c.x, c.residual, c.w, Tensor(), 1e-5,
                                 kernels::ResidualDropout{}, Tensor(), c.y, Tensor(), c.sum, stat,
                                 stat);
    });
    EXPECT_MENTIONS(msg, "layer_norm_forward: unsupported dtypes");
    EXPECT_MENTIONS(msg, c.expected);
  }
}

TEST(Views, OnlyASingleMinusOneIsInferred) {
  const Tensor x = Tensor::zeros({2, 3});
  EXPECT_EQ(x.view({-1, 3}).shape(), (Shape{2, 3}));
  EXPECT_EQ(x.reshape({3, -1}).shape(), (Shape{3, 2}));
  for (const Shape& bad : {Shape{-2, -3}, Shape{-3, -2}, Shape{-6}, Shape{-1, -1}, Shape{2, -3}}) {
    EXPECT_MENTIONS(error_of([&] { x.view(bad); }), "view");
    EXPECT_MENTIONS(error_of([&] { x.reshape(bad); }), "reshape");
  }
  EXPECT_MENTIONS(error_of([&] { x.view({-2, -3}); }), "-2");
}

TEST(KernelErrors, TheFirstBadIndexWinsAndIsRaisedOnce) {
  const Tensor w = Tensor::zeros({4, 2});
  const Tensor out = embedding(w, Tensor::from_vector<int64_t>({0, 9, 7}, {3}));
  // A later op's report does not replace the first one.
  index_select(w, Tensor::from_vector<int64_t>({5}, {1}));
  // The bad rows are zeros, never a read outside the table.
  const std::string msg = error_of([&] { out.to_vector<float>(); });
  EXPECT_MENTIONS(msg, "id 9");
  EXPECT_MENTIONS(msg, "position [1]");
  EXPECT_MENTIONS(msg, "vocabulary size 4");
  EXPECT_EQ(out.to_vector<float>(), std::vector<float>(6, 0.0f));
  EXPECT_NO_THROW(check_kernel_errors());
}

TEST(KernelErrors, CrossEntropyCountsOnlyValidRowsAndNeedsNoHostRead) {
  const Tensor x = Tensor::zeros({3, 4}, DType::f64).set_requires_grad(true);
  const Tensor loss = cross_entropy(x, Tensor::from_vector<int64_t>({1, -100, 2}, {3}));
  EXPECT_NEAR(loss.item(), std::log(4.0), 1e-12);
  loss.backward();
  const auto g = x.grad().to_vector<double>();
  EXPECT_NEAR(g[1], (0.25 - 1.0) / 2.0, 1e-12);              // mean over the 2 counted rows
  for (int c = 4; c < 8; ++c) EXPECT_EQ(g[size_t(c)], 0.0);  // ignored row
  // The count comes out as a device tensor next to the loss.
  const auto [loss2, count, correct] =
      cross_entropy_with_counts(x.detach(), Tensor::from_vector<int32_t>({-100, -100, 3}, {3}));
  EXPECT_EQ(count.dtype(), DType::i64);
  EXPECT_EQ(count.item(), 1.0);
  EXPECT_NEAR(loss2.item(), std::log(4.0), 1e-12);
  // All-zero logits: argmax is column 0, so target 3 is a miss.
  EXPECT_EQ(correct.dtype(), DType::i64);
  EXPECT_EQ(correct.item(), 0.0);
  EXPECT_EQ(cross_entropy_with_counts(x.detach(), Tensor::full({3}, -100, DType::i64)).count.item(),
            0.0);
}

// `correct` follows argmax's rule (the first NaN, else the first largest)
// on the rows it counts, and ignores the others.
TEST(KernelErrors, CrossEntropyCountsTheRowsWhoseArgmaxIsTheTarget) {
  const double nan = std::nan(""), inf = INFINITY;
  for (DType dtype : {DType::f32, DType::f64, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor x = Tensor::from_vector<double>({1,    5,    5,    2,     // tie: the first 5
                                                  1,    5,    5,    2,     // the second 5 loses
                                                  0,    nan,  9,    nan,   // the first NaN
                                                  0,    9,    9,    nan,   // a NaN beats 9
                                                  -inf, -inf, -inf, -inf,  // all -inf: column 0
                                                  3,    inf,  2,    inf,   // the first inf
                                                  7,    1,    2,    3,     // hit, but ignored
                                                  0,    0,    0,    8},    // a plain hit
                                                 {8, 4})
                         .to(dtype);
    const Tensor targets = Tensor::from_vector<int64_t>({1, 2, 1, 3, 0, 1, -100, 3}, {8});
    const auto out = cross_entropy_with_counts(x, targets);
    EXPECT_EQ(out.count.item(), 7.0);
    // Hits: rows 0, 2, 3, 4, 5 and 7 (row 1 is the tie's loser, row 6 ignored).
    EXPECT_EQ(out.correct.item(), 6.0);
    // The same as argmax against the counted targets.
    const auto best = argmax(x, 1).to_vector<int64_t>();
    const auto t = targets.to_vector<int64_t>();
    int64_t hits = 0;
    for (size_t r = 0; r < t.size(); ++r) hits += t[r] != -100 && best[r] == t[r];
    EXPECT_EQ(out.correct.item(), double(hits));
  }
}

TEST(KernelTensor, CarriesPointerDtypeSizesAndStrides) {
  const Tensor t = Tensor::zeros({4, 6}).narrow(1, 1, 3).transpose(0, 1);
  const kernels::KernelTensor k = kernels::kernel_tensor(t);
  EXPECT_EQ(k.data, t.data());
  EXPECT_EQ(k.dtype, DType::f32);
  EXPECT_EQ(k.ndim, 2);
  EXPECT_EQ(k.sizes[0], 3);
  EXPECT_EQ(k.sizes[1], 4);
  EXPECT_EQ(k.strides[0], 1);
  EXPECT_EQ(k.strides[1], 6);
  EXPECT_FALSE(k.is_contiguous());
  EXPECT_FALSE(kernels::kernel_tensor(Tensor()).defined());
}

// The offsets of row-major index i over (ndim, sizes, strides of operand k).
int64_t walk_offset(int64_t i, int32_t ndim, const int64_t* sizes, const int64_t* strides) {
  int64_t off = 0;
  for (int32_t d = ndim - 1; d >= 0; --d) {
    off += (i % sizes[d]) * strides[d];
    i /= sizes[d];
  }
  return off;
}

// The rope kernels divide by a FastDivmod: every divisor class (1, powers
// of two and their neighbours, small and large, random) against / and % over
// the dividends where an error would show first (around multiples of the
// divisor, the range's ends) and random ones.
TEST(FastDivmod, QuotientAndRemainderAreExactBelowTwoToThe31) {
  using kernels::FastDivmod;
  const uint32_t limit = uint32_t(kernels::kFastDivmodLimit);
  std::mt19937 rng(5);
  std::vector<uint32_t> divisors;
  for (uint32_t d = 1; d <= 2048; ++d) divisors.push_back(d);
  for (int k = 1; k <= 31; ++k) {
    const uint32_t p = uint32_t(1) << k;
    divisors.insert(divisors.end(), {p - 1, p, p + 1});
  }
  for (int i = 0; i < 2000; ++i) divisors.push_back(rng() % limit + 1);
  int64_t checked = 0;
  for (const uint32_t d : divisors) {
    if (d > limit) continue;
    const FastDivmod fast(d);
    std::vector<uint32_t> dividends = {0, 1, limit - 1, limit - 2, d - 1, d};
    for (int i = 0; i < 64; ++i) dividends.push_back(rng() % limit);
    for (const uint64_t q : {uint64_t(1), uint64_t(2), uint64_t(limit - 1) / d, uint64_t(limit) / d,
                             uint64_t(rng() % limit) / d})
      for (const int64_t delta : {-1, 0, 1}) {
        const int64_t n = int64_t(q * d) + delta;
        if (n >= 0 && n < int64_t(limit)) dividends.push_back(uint32_t(n));
      }
    for (const uint32_t n : dividends) {
      if (n >= limit) continue;
      uint32_t quotient = 0, remainder = 0;
      fast.divmod(n, quotient, remainder);
      ASSERT_EQ(quotient, n / d) << n << " / " << d;
      ASSERT_EQ(remainder, n % d) << n << " % " << d;
      ++checked;
    }
  }
  EXPECT_GT(checked, 300000);
}

TEST(CoalesceDims, EveryElementKeepsItsOffsetsAndContiguousCallsAreFlat) {
  using kernels::coalesce_dims;
  using kernels::kMaxDims;
  std::mt19937 rng(11);
  for (int trial = 0; trial < 400; ++trial) {
    const int32_t ndim = int32_t(rng() % 5) + 1;
    int64_t sizes[kMaxDims] = {};
    for (int32_t d = 0; d < ndim; ++d) sizes[d] = int64_t(rng() % 4) + 1;
    // Operand 0 contiguous; 1 broadcast on random dims; 2 a permuted (transposed)
    // layout; 3 every other element of a wider buffer.
    int64_t strides[3 + 1][kMaxDims] = {};
    int64_t s = 1;
    for (int32_t d = ndim - 1; d >= 0; --d) {
      strides[0][d] = s;
      strides[1][d] = rng() % 2 ? 0 : s;
      strides[3][d] = 2 * s;
      s *= sizes[d];
    }
    std::vector<int32_t> order(size_t(ndim), 0);
    for (int32_t d = 0; d < ndim; ++d) order[size_t(d)] = d;
    std::shuffle(order.begin(), order.end(), rng);
    s = 1;
    for (int32_t d : order) {
      strides[2][d] = s;
      s *= sizes[d];
    }
    int64_t csizes[kMaxDims], cstrides[4][kMaxDims];
    std::copy(sizes, sizes + kMaxDims, csizes);
    std::copy(&strides[0][0], &strides[0][0] + 4 * kMaxDims, &cstrides[0][0]);
    const int32_t cdim = coalesce_dims(ndim, csizes, cstrides, 4);
    for (int64_t i = 0; i < s; ++i)
      for (int k = 0; k < 4; ++k)
        ASSERT_EQ(walk_offset(i, cdim, csizes, cstrides[k]),
                  walk_offset(i, ndim, sizes, strides[k]))
            << "trial " << trial << ", element " << i << ", operand " << k;
  }
  // Contiguous operands of one shape: one dim. A bias over rows: two.
  int64_t sizes[kMaxDims] = {4, 3, 8};
  int64_t strides[2][kMaxDims] = {{24, 8, 1}, {24, 8, 1}};
  EXPECT_EQ(coalesce_dims(3, sizes, strides, 2), 1);
  EXPECT_EQ(sizes[0], 96);
  int64_t bias_sizes[kMaxDims] = {4, 3, 8};
  int64_t bias_strides[2][kMaxDims] = {{24, 8, 1}, {0, 0, 1}};
  EXPECT_EQ(coalesce_dims(3, bias_sizes, bias_strides, 2), 2);
  EXPECT_EQ(bias_sizes[0], 12);
  EXPECT_EQ(bias_sizes[1], 8);
  // Only dims of size 1: no dim left (offset 0 for the one element).
  int64_t ones[kMaxDims] = {1, 1};
  int64_t ones_strides[1][kMaxDims] = {{5, 7}};
  EXPECT_EQ(coalesce_dims(2, ones, ones_strides, 1), 0);
}

TEST(RandomFill, ANormalFillAtAnyWordOffsetDrawsWordsWordAndWordPlusOne) {
  constexpr uint64_t kSeed = 99;
  for (uint64_t offset : {0, 1, 2, 3, 6, 7}) {
    const Tensor t = Tensor::empty({5}, DType::f64);
    launch::random_fill(Device::cpu(), t, kSeed, offset, /*normal=*/true);
    const std::vector<double> got = t.to_vector<double>();
    for (uint64_t i = 0; i < got.size(); ++i) {
      const uint64_t word = offset + 2 * i;
      const double u1 = open_uniform_from_bits(philox_word(kSeed, word));
      const double u2 = open_uniform_from_bits(philox_word(kSeed, word + 1));
      EXPECT_EQ(got[i], std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2))
          << "offset " << offset << ", element " << i;
    }
  }
}

TEST(KernelTensor, ATensorWithNoElementIsContiguousAsTheTensorSaysAndRandomFillsIt) {
  const Tensor t = Tensor::empty({2, 3, 0, 4});
  ASSERT_TRUE(t.is_contiguous());
  EXPECT_TRUE(kernels::kernel_tensor(t).is_contiguous());
  Generator gen{5, 0};
  EXPECT_EQ(Tensor::randn({2, 3, 0, 4}, gen).numel(), 0);
}

// The CPU's vectorised Philox gives philox4x32's words block by block (16
// blocks: AVX-512 where the build has it, the portable loop otherwise; 8
// blocks: always the portable loop), and the dropout draws are their 16-bit
// halves in the rule's order.
TEST(PhiloxSimd, BlocksAndDrawsEqualTheScalarGenerator) {
  const PhiloxKey key{{0x12345678u, 0x9ABCDEF0u}};
  for (const uint32_t first : {0u, 5u, 0xFFFFFFF8u}) {
    uint32_t words16[64], words8[32];
    uint16_t draws[128];
    kernels::cpu::philox_blocks<16>(first, 7u, 0xDEADBEEFu, 3u << 8, key, words16);
    kernels::cpu::philox_blocks<8>(first, 7u, 0xDEADBEEFu, 3u << 8, key, words8);
    kernels::cpu::dropout_draws_blocks<16>(first, 7u, 0xDEADBEEFu, 3u << 8, key, draws);
    for (uint32_t i = 0; i < 16; ++i) {
      const PhiloxCounter want =
          philox4x32(PhiloxCounter{{first + i, 7u, 0xDEADBEEFu, 3u << 8}}, key);
      for (int w = 0; w < 4; ++w) {
        ASSERT_EQ(words16[4 * i + w], want[w]) << "block " << i << " word " << w;
        if (i < 8) {
          ASSERT_EQ(words8[4 * i + w], want[w]) << "block " << i << " word " << w;
        }
        ASSERT_EQ(draws[8 * i + 2 * w], want[w] & 0xFFFFu);
        ASSERT_EQ(draws[8 * i + 2 * w + 1], want[w] >> 16);
      }
    }
  }
}

// launch:: counts each call under its kernel of the list as well as in all.
TEST(KernelCalls, EachCallIsCountedUnderItsKernel) {
  const auto fill_id = size_t(kernels::KernelId::fill), copy_id = size_t(kernels::KernelId::copy);
  EXPECT_STREQ(kernels::kernel_name(kernels::KernelId::fill), "fill");
  EXPECT_STREQ(kernels::kernel_name(kernels::KernelId::matmul_accumulate), "matmul_accumulate");
  const uint64_t all = kernels::kernel_calls(), fills = kernels::kernel_calls_by_id[fill_id],
                 copies = kernels::kernel_calls_by_id[copy_id];
  Tensor t = Tensor::empty({4});
  launch::fill(Device::cpu(), t, 1.0);
  launch::fill(Device::cpu(), t, 2.0);
  launch::copy(Device::cpu(), Tensor::zeros({4}), t);
  EXPECT_EQ(kernels::kernel_calls_by_id[fill_id] - fills, 3u) << "Tensor::zeros fills too";
  EXPECT_EQ(kernels::kernel_calls_by_id[copy_id] - copies, 1u);
  EXPECT_EQ(kernels::kernel_calls() - all, 4u);
}

}  // namespace
}  // namespace roformer
