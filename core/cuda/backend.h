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

// The CUDA stream a Stream names (nullptr: the legacy default stream).
inline cudaStream_t native(const Stream& stream) {
  return static_cast<cudaStream_t>(stream.handle);
}

}  // namespace roformer::cuda
