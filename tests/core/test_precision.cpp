// bf16 mixed precision (core/precision.h): the scope, the per-version weight
// cache, the CPU-feature check and thread-count independence of the bf16
// products. The numbers of each op under autocast are in the op table.
#include <gtest/gtest.h>
#include <omp.h>

#include "core/ops.h"
#include "core/precision.h"
#include "gradcheck.h"
#include "tests/test_support.h"

namespace roformer {
namespace {

using testing::random_f64;

Tensor random_f32(const Shape& shape, uint64_t seed) {
  NoGradGuard no_grad;
  return random_f64(shape, seed, -1.0, 1.0).to(DType::f32);
}

TEST(Precision, ScopeSetsAndRestores) {
  EXPECT_EQ(matmul_dtype(), DType::f32);
  {
    MatmulPrecisionScope outer(DType::bf16);
    EXPECT_EQ(matmul_dtype(), DType::bf16);
    {
      MatmulPrecisionScope inner(DType::f32);
      EXPECT_EQ(matmul_dtype(), DType::f32);
    }
    EXPECT_EQ(matmul_dtype(), DType::bf16);
    EXPECT_TRUE(autocast_bf16(Device::cpu(), DType::f32));
    EXPECT_FALSE(autocast_bf16(Device::cpu(), DType::f64));  // gradient checks stay f64
  }
  EXPECT_EQ(matmul_dtype(), DType::f32);
  EXPECT_THROW(MatmulPrecisionScope(DType::f64), Error);
}

TEST(Precision, WeightIsCastOncePerVersion) {
  Tensor w = random_f32({8, 16}, 1);
  w.set_requires_grad(true);
  const Tensor x = random_f32({4, 16}, 2);
  MatmulPrecisionScope bf16_products(DType::bf16);
  const int64_t before = bf16_weight_casts();
  const Tensor y1 = linear(x, w);
  const Tensor y2 = linear(x, w);  // a second micro-batch: no new cast
  EXPECT_EQ(bf16_weight_casts(), before + 1);
  EXPECT_EQ(y1.to_vector<float>(), y2.to_vector<float>());
  {
    NoGradGuard no_grad;
    w.fill_(0.5);  // what an optimizer step or a load does: a new version
  }
  const Tensor y3 = linear(x, w);
  EXPECT_EQ(bf16_weight_casts(), before + 2);
  const std::vector<float> xs = x.to_vector<float>(), got = y3.to_vector<float>();
  for (int64_t r = 0; r < 4; ++r) {
    double expect = 0;  // 0.5 is exact in bf16; x is rounded to bf16
    for (int64_t c = 0; c < 16; ++c) expect += 0.5 * double(float(bf16(xs[size_t(r * 16 + c)])));
    EXPECT_NEAR(got[size_t(r * 8)], expect, 1e-4) << "row " << r;
  }
}

// stacked_linear's bf16 weight: its parts' bf16 copies stacked once per
// version of each part, as bf16_weight casts once; a write to any part
// restacks. As is (f32), the parts are stacked anew each call.
TEST(Precision, StackedWeightIsBuiltOncePerVersionOfItsParts) {
  Tensor a = random_f32({3, 4}, 5), b = random_f32({2, 4}, 6);
  const int64_t before = stacked_weight_builds();
  const Tensor first = stacked_weight({a, b}, true);
  const Tensor again = stacked_weight({a, b}, true);
  EXPECT_EQ(first.data(), again.data()) << "a second micro-batch: the same stack";
  EXPECT_EQ(first.dtype(), DType::bf16);
  EXPECT_EQ(first.to_vector<float>(), concat({a, b}, 0).to(DType::bf16).to_vector<float>());
  EXPECT_EQ(stacked_weight_builds(), before + 1);
  {
    NoGradGuard no_grad;
    b.fill_(0.25);  // an optimizer step writes one part
  }
  const Tensor restacked = stacked_weight({a, b}, true);
  EXPECT_EQ(stacked_weight_builds(), before + 2);
  EXPECT_EQ(restacked.to_vector<float>()[12], 0.25f) << "b's first element, after a's 12";
  // As is: a write through the data pointer (no new version) still shows.
  b.data_as<float>()[0] = 0.5f;
  EXPECT_EQ(stacked_weight({a, b}, false).to_vector<float>()[12], 0.5f);
  EXPECT_EQ(stacked_weight_builds(), before + 2);
  EXPECT_EQ(stacked_weight({a}, false).data(), a.data()) << "one part is the part itself";
}

// What the GPU AdamW does after its pass (optim/adamw.cpp), done by hand: the
// registered working copy serves the weights inside the flat buffer, at their
// offsets, until the buffer's version moves.
TEST(Precision, WorkingCopyServesWeightsUntilTheyChange) {
  const Tensor flat = random_f32({64}, 6);
  const Tensor w = flat.narrow(0, 16, 40).view({5, 8});  // a weight inside the buffer
  const Tensor x = random_f32({3, 8}, 7);
  clear_bf16_weights();
  MatmulPrecisionScope bf16_products(DType::bf16);
  const Tensor reference = linear(x, w);  // through a fresh cast
  const int64_t casts = bf16_weight_casts(), hits = bf16_working_copy_hits();
  Tensor working;
  {
    NoGradGuard no_grad;
    working = mul(flat, 2.0).to(DType::bf16);  // doubled: shows which copy was read
  }
  set_bf16_working_copy(flat, working);
  const std::vector<float> doubled = linear(x, w).to_vector<float>();
  EXPECT_EQ(bf16_working_copy_hits(), hits + 1);
  EXPECT_EQ(bf16_weight_casts(), casts);
  const std::vector<float> ref = reference.to_vector<float>();
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_FLOAT_EQ(doubled[i], 2 * ref[i]) << i;
  flat.bump_version();  // any write: the copy is stale, the weight is cast again
  EXPECT_EQ(linear(x, w).to_vector<float>(), ref);
  EXPECT_EQ(bf16_weight_casts(), casts + 1);
  EXPECT_EQ(bf16_working_copy_hits(), hits + 1);
  EXPECT_THROW(set_bf16_working_copy(flat, flat), Error);  // not bf16
  clear_bf16_weights();
}

TEST(Precision, GradientsReachTheF32Weights) {
  Tensor w = random_f32({8, 16}, 3), b = random_f32({8}, 4);
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  const Tensor x = random_f32({4, 16}, 5);
  MatmulPrecisionScope bf16_products(DType::bf16);
  sum(linear(x, w, b)).backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().dtype(), DType::f32);
  EXPECT_EQ(b.grad().dtype(), DType::f32);
  // d sum / d w[o, i] = sum over rows of bf16(x)[r, i].
  const std::vector<float> xs = x.to_vector<float>(), gw = w.grad().to_vector<float>();
  for (int64_t i = 0; i < 16; ++i) {
    double expect = 0;
    for (int64_t r = 0; r < 4; ++r) expect += double(float(bf16(xs[size_t(r * 16 + i)])));
    EXPECT_NEAR(gw[size_t(i)], expect, 1e-4) << "column " << i;
  }
}

TEST(Precision, CpuWithoutBf16IsRefusedNamingTheKey) {
  set_cpu_bf16_probe_override(false);
  const std::string err =
      testing::error_of<InputError>([] { require_native_bf16("run.precision"); });
  set_cpu_bf16_probe_override(true);
  EXPECT_EQ(testing::error_of<InputError>([] { require_native_bf16("run.precision"); }),
            "no error");
  set_cpu_bf16_probe_override(std::nullopt);
  EXPECT_NE(err.find("run.precision"), std::string::npos) << err;
  EXPECT_NE(err.find("AVX512-BF16"), std::string::npos) << err;
}

// bf16 attention and linear give the same bits for 1 and 2 threads, as f32 does.
TEST(Precision, Bf16ProductsDoNotDependOnThreadCount) {
  const Tensor q = random_f32({2, 4, 24, 16}, 6), k = random_f32({2, 4, 24, 16}, 7),
               v = random_f32({2, 4, 24, 16}, 8), w = random_f32({32, 64}, 9),
               x = random_f32({48, 64}, 10);
  auto run = [&](int threads) {
    omp_set_num_threads(threads);
    MatmulPrecisionScope bf16_products(DType::bf16);
    DropoutContext ctx;
    NoGradGuard no_grad;
    std::vector<float> out = attention(q, k, v, Tensor(), 0.0, false, ctx, 0.25).to_vector<float>();
    const std::vector<float> y = linear(x, w).to_vector<float>();
    out.insert(out.end(), y.begin(), y.end());
    return out;
  };
  const int saved = omp_get_max_threads();
  const std::vector<float> one = run(1), two = run(2);
  omp_set_num_threads(saved);
  EXPECT_EQ(one, two);
}

}  // namespace
}  // namespace roformer
