// The CUDA device services of the kernel list: the current stream (the
// backend's, per device and thread) with the device's error record, reading
// that record back, and waiting for a stream.
#include <mutex>
#include <vector>

#include "core/cuda/kernels/common.cuh"

namespace roformer::kernels::cuda {

namespace {

// One record per device, in device memory, allocated on first use and kept.
KernelError* error_record(int device) {
  static std::mutex mutex;
  static auto* records = new std::vector<KernelError*>();
  std::lock_guard<std::mutex> lock(mutex);
  if (records->size() <= size_t(device)) records->resize(size_t(device) + 1, nullptr);
  KernelError*& record = (*records)[size_t(device)];
  if (!record) {
    ::roformer::cuda::DeviceGuard guard(device);
    RF_CUDA_CHECK(cudaMalloc(&record, sizeof(KernelError)));
    RF_CUDA_CHECK(cudaMemset(record, 0, sizeof(KernelError)));
    RF_CUDA_CHECK(cudaDeviceSynchronize());
  }
  return record;
}

__global__ void write_first_bad(KernelError* record, int32_t site, const unsigned long long* first,
                                KernelTensor ids) {
  record_first_bad(record, site, first, ids);
}

}  // namespace

Stream default_stream(int device_index) {
  const ::roformer::Stream current = ::roformer::cuda::backend().current_stream(device_index);
  Stream s;
  s.device_type = DeviceType::cuda;
  s.device_index = device_index;
  s.native = current.handle;
  s.error = error_record(device_index);
  return s;
}

void take_error(Stream stream, KernelError* host) {
  ::roformer::cuda::DeviceGuard guard(stream.device_index);
  KernelError* record = stream.error ? stream.error : error_record(stream.device_index);
  RF_CUDA_CHECK(
      cudaMemcpyAsync(host, record, sizeof(KernelError), cudaMemcpyDeviceToHost, native(stream)));
  RF_CUDA_CHECK(cudaMemsetAsync(record, 0, sizeof(KernelError), native(stream)));
  RF_CUDA_CHECK(cudaStreamSynchronize(native(stream)));
}

void synchronize(Stream stream) {
  ::roformer::cuda::DeviceGuard guard(stream.device_index);
  RF_CUDA_CHECK(cudaStreamSynchronize(native(stream)));
}

void report_first_bad(const Stream& stream, int32_t site, const unsigned long long* first,
                      const KernelTensor& ids) {
  KernelError* record = stream.error ? stream.error : error_record(stream.device_index);
  RF_LAUNCH(write_first_bad, 1, 1, 0, native(stream), record, site, first, ids);
}

}  // namespace roformer::kernels::cuda
