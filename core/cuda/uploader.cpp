#include "core/cuda/uploader.h"

#include <cstring>

#include "core/cuda/backend.h"

namespace roformer::cuda {

PinnedUploader::PinnedUploader(int device, int slots) : device_(device), slots_(size_t(slots)) {
  DeviceGuard guard(device_);
  side_ = CudaStream::create_non_blocking();
  for (Slot& slot : slots_) slot.copied = CudaEvent::create();
}

PinnedUploader::~PinnedUploader() {
  // Pinned buffers must outlive the copies out of them.
  cudaStreamSynchronize(side_.get());
}

Stream PinnedUploader::stream() const {
  return Stream{Device::cuda(device_), side_.get()};
}

void PinnedUploader::upload(void* dst, const void* src, size_t nbytes) {
  if (nbytes == 0) return;
  DeviceGuard guard(device_);
  Slot& slot = slots_[next_];
  next_ = (next_ + 1) % slots_.size();
  if (slot.in_flight) slot.copied.synchronize();  // its last copy must be done
  if (slot.buffer.size() < nbytes) slot.buffer = PinnedMemory(nbytes + nbytes / 4);
  std::memcpy(slot.buffer.get(), src, nbytes);
  RF_CUDA_CHECK(
      cudaMemcpyAsync(dst, slot.buffer.get(), nbytes, cudaMemcpyHostToDevice, side_.get()));
  slot.copied.record(side_.get());
  slot.in_flight = true;
  unpublished_.push_back(dst);
}

void PinnedUploader::publish(const Stream& consumer) {
  DeviceGuard guard(device_);
  CudaEvent done = CudaEvent::create();
  done.record(side_.get());
  done.block(native(consumer));
  CachingAllocator& allocator = caching_allocator(device_);
  for (void* dst : unpublished_) allocator.record_stream(dst, native(consumer));
  unpublished_.clear();
}

}  // namespace roformer::cuda
