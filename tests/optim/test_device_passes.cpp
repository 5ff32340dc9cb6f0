// The host side of the optimizer's GPU passes: AdamW's update runs become the
// kernel's segments covering the whole flat buffer, gaps (parameters without
// a gradient) as segments it skips. The kernels themselves are checked
// against the host loop in tests/cuda/test_cuda_math.cpp.
#include <gtest/gtest.h>

#include <string>

#include "optim/device_passes.h"

namespace roformer::optim::device_passes {
namespace {

constexpr uint8_t kNoDecay = 0, kDecay = 1, kSkip = 2;

TEST(DevicePassSegments, RunsAndGapsCoverTheBuffer) {
  // Decay [0, 10), a gap [10, 16), no decay [16, 20), decay [20, 30), tail gap.
  const Segments s = segments_of({{0, 10, true}, {16, 20, false}, {20, 30, true}}, 40);
  EXPECT_EQ(s.starts, (std::vector<int64_t>{0, 10, 16, 20, 30, 40}));
  EXPECT_EQ(s.modes, (std::vector<uint8_t>{kDecay, kSkip, kNoDecay, kDecay, kSkip}));
}

TEST(DevicePassSegments, NeighbouringRunsOfOneSettingMerge) {
  const Segments s = segments_of({{0, 8, true}, {8, 16, true}, {20, 24, false}}, 24);
  EXPECT_EQ(s.starts, (std::vector<int64_t>{0, 16, 20, 24}));
  EXPECT_EQ(s.modes, (std::vector<uint8_t>{kDecay, kSkip, kNoDecay}));
}

TEST(DevicePassSegments, NoRunsSkipsEverything) {
  const Segments s = segments_of({}, 64);
  EXPECT_EQ(s.starts, (std::vector<int64_t>{0, 64}));
  EXPECT_EQ(s.modes, (std::vector<uint8_t>{kSkip}));
}

TEST(DevicePassSegments, ALeadingGapIsSkipped) {
  const Segments s = segments_of({{16, 32, false}}, 32);
  EXPECT_EQ(s.starts, (std::vector<int64_t>{0, 16, 32}));
  EXPECT_EQ(s.modes, (std::vector<uint8_t>{kSkip, kNoDecay}));
}

TEST(DevicePassSegments, OverlappingOrOutOfRangeRunsAreRefused) {
  EXPECT_THROW(segments_of({{0, 10, true}, {5, 12, true}}, 20), Error);
  EXPECT_THROW(segments_of({{0, 30, true}}, 20), Error);
  EXPECT_THROW(segments_of({{8, 4, true}}, 20), Error);
}

TEST(DevicePasses, HostBuffersAreRefused) {
  // The passes are for device buffers; the CPU has its own loops.
  const Tensor g = Tensor::zeros({32});
  EXPECT_THROW(grad_summary(g), Error);
  EXPECT_THROW(adamw(g, g, g, g, {{0, 32, true}}, {}), Error);
  // A build with the passes names the tensor it was given.
  std::string err;
  try {
    grad_summary(g, "the weights");
  } catch (const Error& e) {
    err = e.what();
  }
  if (err.find("no update kernels") == std::string::npos) {
    EXPECT_NE(err.find("the weights must be a contiguous f32 GPU tensor"), std::string::npos)
        << err;
  }
}

}  // namespace
}  // namespace roformer::optim::device_passes
