// The CUDA backend below the kernels: error checks, devices, copies, streams,
// the caching allocator and batch uploads.
#include <cuda_runtime.h>

#include <vector>

#include "core/batch_upload.h"
#include "core/cuda/check.h"
#include "core/cuda/segment_arena.h"
#include "core/ops.h"
#include "tests/cuda/gpu_test.h"
#include "tests/test_support.h"

namespace roformer {
namespace {

using testing::error_of;
using testing::kGpu;

TEST(CudaCheck, AFailedCallIsAnErrorNamingTheCall) {
  const std::string message = error_of([] { RF_CUDA_CHECK(cudaErrorInvalidValue); });
  EXPECT_NE(message.find("CUDA call cudaErrorInvalidValue failed: invalid argument"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("test_cuda_runtime.cpp:"), std::string::npos) << message;
  const std::string blas = error_of([] { RF_CUDA_CHECK(CUBLAS_STATUS_NOT_SUPPORTED); });
  EXPECT_NE(blas.find("cuBLAS call CUBLAS_STATUS_NOT_SUPPORTED failed"), std::string::npos) << blas;
  RF_CUDA_CHECK(cudaSuccess);
}

TEST(CudaDevice, WithoutAGpuCudaTensorsAreAnErrorNamingTheDevice) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is present";
  const std::string message = error_of([] { Tensor::empty({4}, DType::f32, Device::cuda(0)); });
  EXPECT_NE(message.find("cuda:0 is not available: 0 CUDA devices are visible"), std::string::npos)
      << message;
}

TEST(CudaDevice, IndexBeyondTheVisibleDevicesIsAnError) {
  RF_REQUIRE_GPU();
  const Device beyond = Device::cuda(cuda::device_count());
  EXPECT_NE(error_of([&] { Tensor::empty({1}, DType::f32, beyond); }).find(beyond.str()),
            std::string::npos);
}

TEST(CudaDevice, CopiesRoundTripAcrossDevices) {
  RF_REQUIRE_GPU();
  Generator gen{3, 0};
  const Tensor host = Tensor::randn({5, 7}, gen);
  const Tensor dev = host.to(kGpu);
  EXPECT_EQ(dev.device(), kGpu);
  EXPECT_EQ(dev.to(Device::cpu()).to_vector<float>(), host.to_vector<float>());
  EXPECT_EQ(dev.to_vector<float>(), host.to_vector<float>());
  // A strided host source, a dtype change on the way, and every factory.
  const Tensor transposed = host.transpose(0, 1).to(kGpu);
  EXPECT_EQ(transposed.to_vector<float>(), host.transpose(0, 1).contiguous().to_vector<float>());
  Tensor as_bf16 = Tensor::empty({5, 7}, DType::bf16, kGpu);
  as_bf16.copy_(host);
  EXPECT_EQ(as_bf16.to_vector<float>(), host.to(DType::bf16).to_vector<float>());
  EXPECT_EQ(Tensor::from_vector<int64_t>({4, 5, 6}, {3}, kGpu).to_vector<int64_t>(),
            (std::vector<int64_t>{4, 5, 6}));
  EXPECT_EQ(Tensor::arange(0, 4, DType::i32, kGpu).to_vector<int32_t>(),
            (std::vector<int32_t>{0, 1, 2, 3}));
  Generator a{9, 0}, b{9, 0};
  EXPECT_EQ(Tensor::rand({33}, a, DType::f32, kGpu).to_vector<float>(),
            Tensor::rand({33}, b).to_vector<float>());
  // Into a CPU view: the device side lands contiguous, then scatters.
  Tensor target = Tensor::zeros({7, 5});
  target.transpose(0, 1).copy_(dev);
  EXPECT_EQ(target.to_vector<float>(), host.transpose(0, 1).contiguous().to_vector<float>());
}

TEST(CudaDevice, GradientsFlowBackThroughTo) {
  RF_REQUIRE_GPU();
  Tensor x = Tensor::from_vector<float>({1, 2, 3}, {3});
  x.set_requires_grad(true);
  const Tensor y = x.to(kGpu).to(Device::cpu());
  sum(mul(y, 2.0)).backward();
  EXPECT_EQ(x.grad().device(), Device::cpu());
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{2, 2, 2}));
}

TEST(CudaStreams, CurrentStreamIsPerDeviceAndScoped) {
  RF_REQUIRE_GPU();
  EXPECT_EQ(current_stream(kGpu).handle, nullptr);  // the default stream
  cudaStream_t side = nullptr;
  RF_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  {
    StreamGuard guard(Stream{kGpu, side});
    EXPECT_EQ(current_stream(kGpu).handle, side);
    const Tensor t = Tensor::from_vector<float>({1, 2}, {2}, kGpu);
    synchronize(current_stream(kGpu));
    EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{1, 2}));
  }
  EXPECT_EQ(current_stream(kGpu).handle, nullptr);
  RF_CUDA_CHECK(cudaStreamDestroy(side));
}

TEST(CudaAllocator, CachesReusesPerStreamAndReleases) {
  RF_REQUIRE_GPU();
  cuda::CachingAllocator& alloc = cuda::caching_allocator(0);
  alloc.release_cached();
  alloc.reset_peak();
  // Earlier tests may hold small pieces on the default stream (their segments
  // stay): the small pool is checked on streams of its own, and every figure
  // is a change from `start`.
  const AllocatorStats start = alloc.stats();
  constexpr size_t kSegment = cuda::SegmentArena::kSegmentBytes;
  cudaStream_t own = nullptr, side = nullptr;
  RF_CUDA_CHECK(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking));
  RF_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  void* first = nullptr;
  {
    StreamGuard guard(Stream{kGpu, own});
    // Small requests are pieces of a segment: the first brings one in.
    first = alloc.allocate(3000);
    EXPECT_EQ(alloc.stats().allocated_bytes, start.allocated_bytes + 3072);
    EXPECT_EQ(alloc.stats().reserved_bytes(), start.reserved_bytes() + kSegment);
    void* second = alloc.allocate(100000);  // the same segment, right after
    EXPECT_EQ(static_cast<char*>(second), static_cast<char*>(first) + 3072);
    alloc.deallocate(second, 100000);
    alloc.deallocate(first, 3000);
    EXPECT_EQ(alloc.stats().cached_bytes, start.cached_bytes + kSegment);
    void* again = alloc.allocate(2900);  // best fit on the same stream: the same place
    EXPECT_EQ(again, first);
    EXPECT_EQ(alloc.stats().num_cache_hits, start.num_cache_hits + 2);
    alloc.deallocate(again, 2900);
  }
  // Large blocks: a request up to a quarter smaller than a cached block takes
  // it (a size that varies per step must not add a block for every new
  // value); a smaller one gets a block of its own.
  void* large = alloc.allocate(size_t(5) << 20);
  alloc.deallocate(large, size_t(5) << 20);
  void* near = alloc.allocate(size_t(4) << 20);  // the 4 MiB bin, a quarter below 5
  EXPECT_EQ(near, large);
  EXPECT_EQ(alloc.stats().allocated_bytes, start.allocated_bytes + (size_t(5) << 20));
  void* small = alloc.allocate(size_t(3) << 20);
  EXPECT_NE(small, large);
  alloc.deallocate(small, size_t(3) << 20);
  alloc.deallocate(near, 0);
  alloc.release_cached();
  EXPECT_EQ(alloc.stats().cached_bytes, start.cached_bytes);
  {
    StreamGuard guard(Stream{kGpu, own});
    first = alloc.allocate(3000);
    alloc.deallocate(first, 3000);
  }
  // Another stream does not take a block whose last use it is not ordered after.
  {
    StreamGuard guard(Stream{kGpu, side});
    void* other = alloc.allocate(3000);
    EXPECT_NE(other, first);
    // Used on the default stream too: freed, it waits for that work first.
    alloc.record_stream(other, nullptr);
    alloc.deallocate(other, 3000);
    RF_CUDA_CHECK(cudaDeviceSynchronize());
    void* reused = alloc.allocate(3000);
    EXPECT_EQ(reused, other);
    alloc.deallocate(reused, 3000);
  }
  const AllocatorStats mid = alloc.stats();
  EXPECT_EQ(mid.allocated_bytes, start.allocated_bytes);
  EXPECT_EQ(mid.reserved_bytes(), start.reserved_bytes() + 2 * kSegment);  // one per stream
  EXPECT_GE(mid.peak_reserved_bytes, mid.reserved_bytes());
  alloc.release_cached();
  EXPECT_EQ(alloc.stats().cached_bytes, start.cached_bytes);
  RF_CUDA_CHECK(cudaStreamDestroy(own));
  RF_CUDA_CHECK(cudaStreamDestroy(side));
  // Out of memory names the device and the size.
  const std::string oom = error_of([&] { alloc.allocate(size_t(1) << 50); });
  EXPECT_NE(oom.find("cuda:0: out of memory allocating"), std::string::npos) << oom;
}

// A request the device can meet only once the cache lets go of its blocks:
// the allocator frees what it caches and tries again rather than failing.
TEST(CudaAllocator, OutOfMemoryReleasesTheCacheAndRetries) {
  RF_REQUIRE_GPU();
  cuda::CachingAllocator& alloc = cuda::caching_allocator(0);
  alloc.release_cached();
  size_t free_bytes = 0, total_bytes = 0;
  RF_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  // Three blocks of a quarter of what is free, freed into the cache: about a
  // quarter stays free on the device.
  const size_t quarter = free_bytes / 4 / (size_t(1) << 20) * (size_t(1) << 20);
  std::vector<void*> blocks;
  for (int i = 0; i < 3; ++i) blocks.push_back(alloc.allocate(quarter));
  for (void* b : blocks) alloc.deallocate(b, quarter);
  const size_t cached = alloc.stats().cached_bytes;
  ASSERT_GE(cached, 3 * quarter);
  // Half of what was free: too large for a cached block (more than a quarter
  // above them) and for what the device has left, so only the retry meets it.
  const size_t half = 2 * quarter;
  void* big = nullptr;
  ASSERT_NO_THROW(big = alloc.allocate(half));
  ASSERT_NE(big, nullptr);
  EXPECT_LT(alloc.stats().cached_bytes, cached) << "the cached blocks were released";
  alloc.deallocate(big, half);
  alloc.release_cached();
}

TEST(CudaUpload, BatchesArriveThroughPinnedBuffersOnASideStream) {
  RF_REQUIRE_GPU();
  BatchUploader up(kGpu);
  std::vector<Tensor> sent, arrived;
  for (int step = 0; step < 6; ++step) {  // more batches than pinned slots
    std::vector<int32_t> ids(1000 + size_t(step) * 300);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i * 7 + size_t(step));
    sent.push_back(Tensor::from_vector(ids, {int64_t(ids.size())}));
    arrived.push_back(up.upload(sent.back()));
  }
  up.publish();
  for (size_t i = 0; i < sent.size(); ++i) {
    EXPECT_EQ(arrived[i].device(), kGpu);
    EXPECT_EQ(arrived[i].to_vector<int32_t>(), sent[i].to_vector<int32_t>());
  }
}

}  // namespace
}  // namespace roformer
