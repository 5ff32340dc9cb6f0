// Batches move to the device on a side stream: on CUDA through pinned staging
// buffers, so the copy of the next batch overlaps the current step's compute.
// On the CPU it is a no-op that hands the host tensors through.
#pragma once

#include <memory>
#include <vector>

#include "core/device_backend.h"
#include "core/tensor.h"

namespace roformer {

class BatchUploader {
 public:
  explicit BatchUploader(Device device);
  ~BatchUploader();
  BatchUploader(const BatchUploader&) = delete;
  BatchUploader& operator=(const BatchUploader&) = delete;

  Device device() const { return device_; }
  // A contiguous copy of the CPU tensor `host` on the device, queued on the
  // side stream (returns once the data is staged).
  Tensor upload(const Tensor& host);
  // Makes the device's current stream wait for every upload so far: call it
  // before ops read the uploaded tensors.
  void publish();

 private:
  Device device_;
  std::unique_ptr<HostUploader> impl_;  // null on the CPU
  // The uploads since the last publish, held so none is freed before
  // publish() marks its memory as used by the current stream (a caller that
  // drops them early, say after an error, leaves no dangling pointer).
  std::vector<Tensor> unpublished_;
};

}  // namespace roformer
