// Owners for CUDA resources: each releases what it holds in its destructor
// (errors there are ignored: a destructor must not throw, and the context may
// already be shutting down). Movable, not copyable.
#pragma once

#include <cstddef>
#include <utility>

#include "core/cuda/check.h"

namespace roformer::cuda {

// Makes `device` current for a scope and restores the previous device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    RF_CUDA_CHECK(cudaGetDevice(&previous_));
    if (device != previous_) RF_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

// A handle released by `Release` (a function object), moved but never copied.
template <class Handle, class Release>
class UniqueHandle {
 public:
  UniqueHandle() = default;
  explicit UniqueHandle(Handle handle) : handle_(handle) {}
  ~UniqueHandle() { reset(); }
  UniqueHandle(UniqueHandle&& other) noexcept : handle_(std::exchange(other.handle_, Handle{})) {}
  UniqueHandle& operator=(UniqueHandle&& other) noexcept {
    if (this != &other) {
      reset();
      handle_ = std::exchange(other.handle_, Handle{});
    }
    return *this;
  }
  UniqueHandle(const UniqueHandle&) = delete;
  UniqueHandle& operator=(const UniqueHandle&) = delete;

  Handle get() const { return handle_; }
  explicit operator bool() const { return handle_ != Handle{}; }
  void reset() {
    if (handle_ != Handle{}) Release{}(handle_);
    handle_ = Handle{};
  }

 private:
  Handle handle_{};
};

struct ReleaseStream {
  void operator()(cudaStream_t s) const { cudaStreamDestroy(s); }
};
struct ReleaseEvent {
  void operator()(cudaEvent_t e) const { cudaEventDestroy(e); }
};
struct ReleaseDeviceMemory {
  void operator()(void* p) const { cudaFree(p); }
};
struct ReleasePinnedMemory {
  void operator()(void* p) const { cudaFreeHost(p); }
};
struct ReleaseCublasLt {
  void operator()(cublasLtHandle_t h) const { cublasLtDestroy(h); }
};

// A stream that does not synchronise with the legacy default stream, so work
// on it overlaps with work elsewhere (e.g. batch uploads during compute).
class CudaStream : public UniqueHandle<cudaStream_t, ReleaseStream> {
 public:
  CudaStream() = default;
  static CudaStream create_non_blocking() {
    cudaStream_t s = nullptr;
    RF_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return CudaStream(s);
  }

 private:
  using UniqueHandle::UniqueHandle;
};

// An event for ordering between streams (no timing, which makes it cheaper).
class CudaEvent : public UniqueHandle<cudaEvent_t, ReleaseEvent> {
 public:
  CudaEvent() = default;
  static CudaEvent create(bool timing = false) {
    cudaEvent_t e = nullptr;
    RF_CUDA_CHECK(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
    return CudaEvent(e);
  }
  void record(cudaStream_t stream) const { RF_CUDA_CHECK(cudaEventRecord(get(), stream)); }
  // Makes `stream` wait (on the device, not the host) for the recorded work.
  void block(cudaStream_t stream) const { RF_CUDA_CHECK(cudaStreamWaitEvent(stream, get(), 0)); }
  bool done() const {
    const cudaError_t status = cudaEventQuery(get());
    if (status == cudaErrorNotReady) {
      cudaGetLastError();  // not an error: clear it
      return false;
    }
    RF_CUDA_CHECK(status);
    return true;
  }
  void synchronize() const { RF_CUDA_CHECK(cudaEventSynchronize(get())); }

 private:
  using UniqueHandle::UniqueHandle;
};

// Device memory straight from cudaMalloc, for long-lived buffers that should
// not sit in the caching allocator (e.g. the cuBLASLt workspace).
class DeviceMemory : public UniqueHandle<void*, ReleaseDeviceMemory> {
 public:
  DeviceMemory() = default;
  explicit DeviceMemory(size_t nbytes) : UniqueHandle(allocate(nbytes)), nbytes_(nbytes) {}
  size_t size() const { return nbytes_; }

 private:
  static void* allocate(size_t nbytes) {
    void* p = nullptr;
    RF_CUDA_CHECK(cudaMalloc(&p, nbytes ? nbytes : 1));
    return p;
  }
  size_t nbytes_ = 0;
};

// Page-locked host memory: copies from it run asynchronously at full speed.
class PinnedMemory : public UniqueHandle<void*, ReleasePinnedMemory> {
 public:
  PinnedMemory() = default;
  explicit PinnedMemory(size_t nbytes) : UniqueHandle(allocate(nbytes)), nbytes_(nbytes) {}
  size_t size() const { return nbytes_; }

 private:
  static void* allocate(size_t nbytes) {
    void* p = nullptr;
    RF_CUDA_CHECK(cudaHostAlloc(&p, nbytes ? nbytes : 1, cudaHostAllocDefault));
    return p;
  }
  size_t nbytes_ = 0;
};

class CublasLtHandle : public UniqueHandle<cublasLtHandle_t, ReleaseCublasLt> {
 public:
  CublasLtHandle() = default;
  static CublasLtHandle create() {
    cublasLtHandle_t h = nullptr;
    RF_CUDA_CHECK(cublasLtCreate(&h));
    return CublasLtHandle(h);
  }

 private:
  using UniqueHandle::UniqueHandle;
};

}  // namespace roformer::cuda
