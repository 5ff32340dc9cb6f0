// Batch uploads: host data is staged in pinned buffers (a ring, reused once
// the copy out of a buffer has finished) and copied on a non-blocking side
// stream, so the copy of batch t+1 overlaps the compute of batch t.
#pragma once

#include <vector>

#include "core/cuda/raii.h"
#include "core/device_backend.h"

namespace roformer::cuda {

class PinnedUploader final : public HostUploader {
 public:
  explicit PinnedUploader(int device, int slots = 4);
  ~PinnedUploader() override;

  Stream stream() const override;
  void upload(void* dst, const void* src, size_t nbytes) override;
  void publish(const Stream& consumer) override;

 private:
  struct Slot {
    PinnedMemory buffer;
    CudaEvent copied;  // recorded after the copy out of `buffer`
    bool in_flight = false;
  };
  int device_;
  CudaStream side_;
  std::vector<Slot> slots_;
  size_t next_ = 0;
  std::vector<void*> unpublished_;  // destinations not yet handed to a consumer
};

}  // namespace roformer::cuda
