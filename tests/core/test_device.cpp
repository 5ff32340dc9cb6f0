// Devices as the tensor core sees them: factories, to(), copy_ across devices,
// streams. Cases that need a GPU live in tests/cuda; here the CPU-visible side
// (errors that name the device, CPU round trips) runs in every build.
#include <gtest/gtest.h>

#include <cmath>

#include "core/batch_upload.h"
#include "core/device_backend.h"
#include "core/ops.h"
#include "core/philox.h"
#include "tests/test_support.h"

namespace roformer {
namespace {

using testing::error_of;

TEST(Device, CudaWithoutAGpuIsAnErrorNamingTheDevice) {
  if (device_count(DeviceType::cuda) > 0) GTEST_SKIP() << "a GPU is visible: cuda:0 exists";
  const std::string message = error_of([] { Tensor::empty({4}, DType::f32, Device::cuda(0)); });
  EXPECT_NE(message.find("cuda:0 is not available"), std::string::npos) << message;
  const Tensor host = Tensor::ones({2, 3});
  EXPECT_NE(error_of([&] { host.to(Device::cuda(1)); }).find("cuda:1"), std::string::npos);
  EXPECT_NE(error_of([] { Tensor::zeros({2}, DType::f32, Device::cuda(0)); }).find("cuda:0"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              Tensor::from_vector<float>({1, 2}, {2}, Device::cuda(0));
            }).find("cuda:0"),
            std::string::npos);
  EXPECT_NE(error_of([] { current_stream(Device::cuda(0)); }).find("cuda:0"), std::string::npos);
  EXPECT_NE(error_of([] { allocator_for(Device::cuda(2)); }).find("cuda:2"), std::string::npos);
  EXPECT_NE(error_of([] { BatchUploader up(Device::cuda(0)); }).find("cuda:0"), std::string::npos);
  EXPECT_FALSE(device_available(Device::cuda(0)));
  EXPECT_TRUE(device_available(Device::cpu()));
}

TEST(Device, ToTheSameDeviceIsTheSameTensor) {
  const Tensor t = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor same = t.to(Device::cpu());
  EXPECT_TRUE(same.shares_storage_with(t));
  EXPECT_EQ(same.to_vector<float>(), t.to_vector<float>());
}

TEST(Device, FactoriesTakeADevice) {
  const Device cpu = Device::cpu();
  EXPECT_EQ(Tensor::arange(2, 5, DType::i64, cpu).to_vector<int64_t>(),
            (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(Tensor::from_vector<int32_t>({7, 8}, {2}, cpu).device(), cpu);
  Generator a{5, 0}, b{5, 0};
  // The device argument does not change the numbers drawn.
  EXPECT_EQ(Tensor::rand({9}, a, DType::f32, cpu).to_vector<float>(),
            Tensor::rand({9}, b).to_vector<float>());
  EXPECT_EQ(Tensor::randn({9}, a, DType::f64, cpu).to_vector<double>(),
            Tensor::randn({9}, b, DType::f64).to_vector<double>());
}

TEST(Device, CpuStreamsAreImmediate) {
  const Stream s = current_stream(Device::cpu());
  EXPECT_TRUE(s.device.is_cpu());
  EXPECT_EQ(s.handle, nullptr);
  { StreamGuard guard(s); }
  synchronize(s);
}

TEST(Device, UploaderOnTheCpuHandsTensorsThrough) {
  BatchUploader up(Device::cpu());
  const Tensor ids = Tensor::from_vector<int32_t>({1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor moved = up.upload(ids.transpose(0, 1));
  up.publish();
  EXPECT_TRUE(moved.is_contiguous());
  EXPECT_EQ(moved.to_vector<int32_t>(), (std::vector<int32_t>{1, 4, 2, 5, 3, 6}));
}

TEST(Allocator, BinsAndReservedMemory) {
  EXPECT_EQ(allocation_bin(0, 512, 1 << 20), 512u);
  EXPECT_EQ(allocation_bin(513, 512, 1 << 20), 1024u);
  EXPECT_EQ(allocation_bin((1 << 20) + 1, 512, 1 << 20), (1u << 20) + (1u << 18));
  auto& alloc = allocator_for(Device::cpu());
  alloc.release_cached();
  alloc.reset_peak();
  { Tensor t = Tensor::empty({1 << 20}); }
  const AllocatorStats s = alloc.stats();
  EXPECT_EQ(s.reserved_bytes(), s.allocated_bytes + s.cached_bytes);
  EXPECT_GE(s.peak_reserved_bytes, size_t(4) << 20);
  alloc.release_cached();
  EXPECT_EQ(alloc.stats().reserved_bytes(), alloc.stats().allocated_bytes);
}

TEST(Allocator, PoisonFillsFreshAllocationsWithNaN) {
  auto& alloc = allocator_for(Device::cpu());
  alloc.set_poison(true);
  const Tensor t = Tensor::empty({3});
  alloc.set_poison(false);
  for (float v : t.to_vector<float>()) EXPECT_TRUE(std::isnan(v));
}

// Random123's known-answer vectors for Philox4x32-10: the generator every
// device shares is the published one.
TEST(Philox, MatchesThePublishedKnownAnswers) {
  const PhiloxCounter zero = philox4x32({{0, 0, 0, 0}}, {{0, 0}});
  EXPECT_EQ(zero[0], 0x6627e8d5u);
  EXPECT_EQ(zero[1], 0xe169c58du);
  EXPECT_EQ(zero[2], 0xbc57ac4cu);
  EXPECT_EQ(zero[3], 0x9b00dbd8u);
  const PhiloxCounter ones = philox4x32({{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}},
                                        {{0xffffffffu, 0xffffffffu}});
  EXPECT_EQ(ones[0], 0x408f276du);
  EXPECT_EQ(ones[3], 0x6d5451fdu);
  const PhiloxCounter pi = philox4x32({{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
                                      {{0xa4093822u, 0x299f31d0u}});
  EXPECT_EQ(pi[0], 0xd16cfe09u);
  EXPECT_EQ(pi[1], 0x94fdccebu);
  EXPECT_EQ(pi[2], 0x5001e420u);
  EXPECT_EQ(pi[3], 0x24126ea1u);
  // philox_word numbers the words as Tensor::rand does.
  Generator g{0x1234, 0};
  const std::vector<double> r = Tensor::rand({6}, g, DType::f64).to_vector<double>();
  for (int i = 0; i < 6; ++i)
    EXPECT_EQ(r[size_t(i)], double(uniform_from_bits(philox_word(0x1234, uint64_t(i)))));
}

// dropout_keep_halves decides both draws of a word as `draw >= threshold`
// does, for every draw in either half (the other half random), under
// thresholds on both sides of 2^15 and at its edges; and under every
// threshold on random words.
TEST(DropoutRule, BothHalvesOfAWordAreDecidedAsTheirDraws) {
  // One word under one threshold: the helper against the rule's comparison.
  auto expect_decided = [](uint32_t word, uint32_t threshold) {
    const uint32_t offset = dropout_halves_offset(threshold);
    const uint32_t expected = uint32_t(dropout_draw_in_word(word, 0) >= threshold) << 15 |
                              uint32_t(dropout_draw_in_word(word, 1) >= threshold) << 31;
    const uint32_t decided = threshold >= kDropoutHighThreshold
                                 ? dropout_keep_halves<true>(word, offset)
                                 : dropout_keep_halves<false>(word, offset);
    return decided == expected;
  };
  PhiloxStream random(7, 1);
  for (const uint32_t threshold : {0u, 1u, 6554u, 32767u, 32768u, 32769u, 39322u, 65535u, 65536u})
    for (uint32_t draw = 0; draw < 65536u; ++draw) {
      const uint32_t other = random.next_u32() & 0xFFFFu;
      for (const uint32_t word : {draw | (other << 16), other | (draw << 16)})
        ASSERT_TRUE(expect_decided(word, threshold))
            << "word " << word << " under threshold " << threshold;
    }
  // Every threshold, on random words.
  for (uint32_t threshold = 0; threshold <= 65536u; ++threshold)
    for (int i = 0; i < 16; ++i) {
      const uint32_t word = random.next_u32();
      ASSERT_TRUE(expect_decided(word, threshold))
          << "word " << word << " under threshold " << threshold;
    }
}

}  // namespace
}  // namespace roformer
