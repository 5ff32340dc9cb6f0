#include <gtest/gtest.h>

#include "core/ops.h"
#include "gradcheck.h"

namespace roformer {
namespace {

using testing::all_close;

TEST(Tensor, FactoriesShapesAndReadBack) {
  Tensor z = Tensor::zeros({2, 3});
  EXPECT_EQ(z.shape(), (Shape{2, 3}));
  EXPECT_EQ(z.strides(), (Shape{3, 1}));
  EXPECT_EQ(z.dtype(), DType::f32);
  EXPECT_TRUE(z.device().is_cpu());
  EXPECT_EQ(z.to_vector<float>(), std::vector<float>(6, 0.0f));
  EXPECT_EQ(Tensor::full({2}, 2.5, DType::f64).to_vector<double>(),
            (std::vector<double>{2.5, 2.5}));
  EXPECT_EQ(Tensor::arange(3, 7).to_vector<int64_t>(), (std::vector<int64_t>{3, 4, 5, 6}));
  Tensor v = Tensor::from_vector<int32_t>({1, 2, 3, 4}, {2, 2});
  EXPECT_EQ(v.dtype(), DType::i32);
  EXPECT_EQ(v.to_vector<double>(), (std::vector<double>{1, 2, 3, 4}));
  EXPECT_THROW(Tensor::from_vector<float>({1, 2, 3}, {2, 2}), Error);
}

TEST(Tensor, ViewsShareStorageAndBumpVersion) {
  Tensor t = Tensor::from_vector<float>({0, 1, 2, 3, 4, 5}, {2, 3});
  Tensor tt = t.transpose(0, 1);
  EXPECT_TRUE(tt.shares_storage_with(t));
  EXPECT_EQ(tt.shape(), (Shape{3, 2}));
  EXPECT_FALSE(tt.is_contiguous());
  EXPECT_EQ(tt.to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(tt.contiguous().to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  Tensor row = t.narrow(0, 1, 1);
  EXPECT_EQ(row.to_vector<float>(), (std::vector<float>{3, 4, 5}));
  Tensor col = t.select(1, 2);
  EXPECT_EQ(col.to_vector<float>(), (std::vector<float>{2, 5}));
  const uint64_t before = t.version();
  col.fill_(9);
  EXPECT_GT(t.version(), before);
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{0, 1, 9, 3, 4, 9}));
  Tensor e = Tensor::from_vector<float>({1, 2}, {2, 1}).expand({2, 3});
  EXPECT_EQ(e.strides()[1], 0);
  EXPECT_EQ(e.to_vector<float>(), (std::vector<float>{1, 1, 1, 2, 2, 2}));
  EXPECT_EQ(t.unsqueeze(0).shape(), (Shape{1, 2, 3}));
  EXPECT_EQ(t.unsqueeze(0).squeeze(0).shape(), (Shape{2, 3}));
  EXPECT_EQ(t.reshape({3, -1}).shape(), (Shape{3, 2}));
  EXPECT_EQ(t.permute({1, 0}).to_vector<float>(), tt.to_vector<float>());
  // A transposed tensor cannot be viewed flat; reshape copies instead.
  EXPECT_THROW(tt.view({6}), Error);
  EXPECT_EQ(tt.reshape({6}).to_vector<float>(), tt.contiguous().to_vector<float>());
}

TEST(Tensor, CastsRoundTripAndBf16Rounds) {
  Tensor t = Tensor::from_vector<float>({1.0f, -2.5f, 3.14159f}, {3});
  EXPECT_EQ(t.to(DType::f64).to(DType::f32).to_vector<float>(), t.to_vector<float>());
  const std::vector<float> b = t.to(DType::bf16).to_vector<float>();
  EXPECT_EQ(b[0], 1.0f);
  EXPECT_EQ(b[1], -2.5f);
  EXPECT_NEAR(b[2], 3.14159f, 0.0079f);  // 8 mantissa bits
  EXPECT_EQ(Tensor::from_vector<float>({2.7f}, {1}).to(DType::i64).to_vector<int64_t>()[0], 2);
}

TEST(Tensor, PhiloxRandomIsKeyedBySeedAndOffset) {
  Generator a{7, 0}, b{7, 0}, c{8, 0};
  const auto x = Tensor::rand({1000}, a).to_vector<float>();
  EXPECT_EQ(x, Tensor::rand({1000}, b).to_vector<float>());
  EXPECT_NE(x, Tensor::rand({1000}, c).to_vector<float>());
  // The offset advanced: the next draw differs from the first.
  EXPECT_NE(x, Tensor::rand({1000}, a).to_vector<float>());
  // Drawing in two halves from the same offset gives the same numbers.
  Generator whole{3, 0}, halves{3, 0};
  const auto all = Tensor::rand({8}, whole).to_vector<float>();
  const auto h1 = Tensor::rand({4}, halves).to_vector<float>();
  const auto h2 = Tensor::rand({4}, halves).to_vector<float>();
  EXPECT_EQ(std::vector<float>(all.begin(), all.begin() + 4), h1);
  EXPECT_EQ(std::vector<float>(all.begin() + 4, all.end()), h2);
  double mean = 0, var = 0;
  Generator g{11, 0};
  const auto n = Tensor::randn({20000}, g, DType::f64).to_vector<double>();
  for (double v : n) mean += v / n.size();
  for (double v : n) var += (v - mean) * (v - mean) / n.size();
  EXPECT_NEAR(mean, 0.0, 0.03);
  EXPECT_NEAR(var, 1.0, 0.05);
  for (float v : x) {
    EXPECT_GE(v, 0.0f);
    EXPECT_LT(v, 1.0f);
  }
}

TEST(Tensor, PrintingIsReadable) {
  const std::string s = Tensor::from_vector<float>({1, 2, 3, 4}, {2, 2}).str();
  EXPECT_NE(s.find("f32[2, 2]"), std::string::npos);
  EXPECT_NE(s.find("[[1, 2],\n [3, 4]]"), std::string::npos) << s;
}

TEST(Allocator, CachesBlocksAndReportsStatistics) {
  auto& alloc = allocator_for(Device::cpu());
  alloc.release_cached();
  const auto before = alloc.stats();
  { Tensor t = Tensor::empty({1024, 1024}); }  // 4 MiB, returned to the cache
  const auto mid = alloc.stats();
  EXPECT_GE(mid.cached_bytes, size_t(4 << 20));
  EXPECT_GE(mid.peak_allocated_bytes, before.allocated_bytes + (4u << 20));
  { Tensor t = Tensor::empty({1024, 1024}); }
  const auto after = alloc.stats();
  EXPECT_EQ(after.num_cache_hits, mid.num_cache_hits + 1);
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_EQ(CpuCachingAllocator::bin_size(1), 64u);
  EXPECT_EQ(CpuCachingAllocator::bin_size(5000), 5120u);
  void* p = alloc.allocate(100);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  alloc.deallocate(p, 100);
  alloc.release_cached();
  EXPECT_EQ(alloc.stats().cached_bytes, 0u);
}

TEST(Device, UnknownDeviceAndMissingKernelAreClearErrors) {
  EXPECT_EQ(parse_device("cuda:1").index, 1);
  try {
    parse_device("tpu");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("'tpu'"), std::string::npos);
  }
}

}  // namespace
}  // namespace roformer
