// Stream: the queue a kernel runs on, as plain data. The CPU runs kernels
// synchronously and ignores `native`; CUDA kernels launch on the
// cudaStream_t it holds. `error` is the device's kernel-error record (in that
// device's memory): kernels that check indices write the first bad one there
// instead of throwing, and the host reads it at its one synchronisation point
// (Tensor::item, Tensor::to_vector, check_kernel_errors). C++17, nvcc-safe.
#pragma once

#include <cstdint>

#include "core/device.h"

namespace roformer::kernels {

// First out-of-range index a kernel met since the record was last taken.
// `site` names the op call (the host keeps its description, see
// core/ops/dispatch.h); `position` is the flat element index in the index
// tensor, `value` the bad id. Only the first report is kept (raised 0 -> 1).
struct KernelError {
  int32_t raised = 0;
  int32_t site = 0;
  int64_t position = 0;
  int64_t value = 0;
};

struct Stream {
  DeviceType device_type = DeviceType::cpu;
  int device_index = 0;
  void* native = nullptr;        // cudaStream_t on CUDA; unused on the CPU
  KernelError* error = nullptr;  // the device's error record (device memory)
};

}  // namespace roformer::kernels
