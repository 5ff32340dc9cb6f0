#include <cuda_runtime.h>

#include "core/allocator.h"
#include "core/cuda/cuda_backend.h"
#include "core/error.h"

namespace roformer::cuda {

namespace {
void check(cudaError_t status, const char* call) {
  if (status != cudaSuccess)
    throw Error(detail::concat("CUDA call ", call, " failed: ", cudaGetErrorString(status)));
}
#define RF_CUDA_CHECK(call) check((call), #call)

// Plain cudaMalloc/cudaFree with statistics; the size-binned caching allocator
// comes with the CUDA kernels.
class CudaAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    void* ptr = nullptr;
    RF_CUDA_CHECK(cudaMalloc(&ptr, nbytes ? nbytes : 1));
    stats_.allocated_bytes += nbytes;
    ++stats_.num_allocations;
    if (stats_.allocated_bytes > stats_.peak_allocated_bytes)
      stats_.peak_allocated_bytes = stats_.allocated_bytes;
    return ptr;
  }
  void deallocate(void* ptr, size_t nbytes) override {
    if (!ptr) return;
    cudaFree(ptr);  // no throw from a destructor path
    stats_.allocated_bytes -= nbytes;
  }
  AllocatorStats stats() const override { return stats_; }
  void reset_peak() override { stats_.peak_allocated_bytes = stats_.allocated_bytes; }
  void release_cached() override {}

 private:
  AllocatorStats stats_;
};
}  // namespace

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return 0;
  return count;
}

bool init_backend(std::string* why) {
  if (device_count() == 0) {
    if (why) *why = "no CUDA device is visible";
    return false;
  }
  static CudaAllocator allocator;
  register_allocator(DeviceType::cuda, &allocator);
  return true;
}

}  // namespace roformer::cuda
