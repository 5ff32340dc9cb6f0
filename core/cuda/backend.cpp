#include "core/cuda/backend.h"

#include <memory>
#include <mutex>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/raii.h"
#include "core/cuda/uploader.h"
#include "core/error.h"

namespace roformer::cuda {

namespace {

constexpr int kMaxDevices = 64;

// The current stream of each device on this thread (nullptr: default stream).
thread_local cudaStream_t t_current[kMaxDevices] = {};

class CudaBackend final : public DeviceBackend {
 public:
  CudaBackend() {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      cudaGetLastError();  // no driver or no device: not an error, just no GPU
      count = 0;
    }
    count_ = count < kMaxDevices ? count : kMaxDevices;
    allocators_.resize(size_t(count_));
  }

  const char* name() const override { return "CUDA"; }
  int device_count() const override { return count_; }

  Allocator& allocator(int index) override { return caching(index); }

  CachingAllocator& caching(int index) {
    check_index(index);
    std::lock_guard<std::mutex> lock(mutex_);
    auto& slot = allocators_[size_t(index)];
    if (!slot)
      slot = std::make_unique<CachingAllocator>(index, [index] { return t_current[index]; });
    return *slot;
  }

  Stream current_stream(int index) override {
    check_index(index);
    return Stream{Device::cuda(index), t_current[index]};
  }

  void set_current_stream(const Stream& stream) override {
    check_index(stream.device.index);
    t_current[stream.device.index] = native(stream);
  }

  void synchronize(const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    RF_CUDA_CHECK(cudaStreamSynchronize(native(stream)));
  }

  void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes,
                  const Stream& stream) override {
    if (nbytes == 0) return;
    DeviceGuard guard(stream.device.index);
    // Unified addressing lets the runtime tell host from device pointers.
    RF_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, native(stream)));
    if (dst_device.is_cpu()) RF_CUDA_CHECK(cudaStreamSynchronize(native(stream)));
    (void)src_device;
  }

  std::unique_ptr<HostUploader> make_uploader(int index) override {
    check_index(index);
    return std::make_unique<PinnedUploader>(index);
  }

 private:
  void check_index(int index) const {
    RF_CHECK(index >= 0 && index < count_, "device cuda:", index, " is not available: ", count_,
             " CUDA device", count_ == 1 ? " is" : "s are", " visible");
  }

  int count_ = 0;
  std::mutex mutex_;
  std::vector<std::unique_ptr<CachingAllocator>> allocators_;
};

CudaBackend& instance() {
  // Never destroyed: storage with static lifetime may be freed after main().
  static auto* backend = new CudaBackend();
  return *backend;
}

}  // namespace

DeviceBackend& backend() {
  return instance();
}

int device_count() {
  return instance().device_count();
}

CachingAllocator& caching_allocator(int device) {
  return instance().caching(device);
}

}  // namespace roformer::cuda
