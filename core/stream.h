// Streams: ordered queues of device work. Kernels receive one explicitly (plain
// data, no CUDA header needed); ops take the device's current stream. CPU work
// runs in order on the calling thread, so a CPU stream carries no handle.
//
// Read by nvcc too: C++17 only.
#pragma once

#include "core/device.h"

namespace roformer {

struct Stream {
  Device device;
  void* handle = nullptr;  // cudaStream_t on CUDA; nullptr is the device's default stream
};

// The stream that work for `device` goes to on this thread (per device index).
// Throws naming the device when this build or machine has no such device.
Stream current_stream(Device device);

// Makes `stream` its device's current stream on this thread.
void set_current_stream(const Stream& stream);

// Sets a current stream for a scope and restores the previous one.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream previous_;
};

// Waits until every piece of work queued on `stream` has finished.
void synchronize(const Stream& stream);

}  // namespace roformer
