// The CUDA device backend (core/device_backend.h): devices, one caching
// allocator per device, the current stream per device and thread, copies.
#pragma once

#include <cuda_runtime.h>

#include "core/cuda/caching_allocator.h"
#include "core/device_backend.h"

namespace roformer::cuda {

// The process's CUDA backend (device_count() is 0 without a driver or GPU).
DeviceBackend& backend();

// Number of visible GPUs (0 when there is no driver or no device).
int device_count();

// The caching allocator of cuda:`device`.
CachingAllocator& caching_allocator(int device);

// Memory from the device's caching allocator for work queued on `stream`,
// given back when it goes (the block is reused only by later work there).
// No block for 0 bytes: get() is then nullptr.
class StreamMemory {
 public:
  StreamMemory(int device, cudaStream_t stream, size_t nbytes)
      : allocator_(&caching_allocator(device)), nbytes_(nbytes) {
    if (nbytes_) ptr_ = allocator_->allocate_on(nbytes_, stream);
  }
  ~StreamMemory() {
    if (ptr_) allocator_->deallocate(ptr_, nbytes_);
  }
  StreamMemory(const StreamMemory&) = delete;
  StreamMemory& operator=(const StreamMemory&) = delete;
  void* get() const { return ptr_; }

 private:
  CachingAllocator* allocator_;
  size_t nbytes_;
  void* ptr_ = nullptr;
};

// The CUDA stream a Stream names (nullptr: the legacy default stream).
inline cudaStream_t native(const Stream& stream) {
  return static_cast<cudaStream_t>(stream.handle);
}

}  // namespace roformer::cuda
