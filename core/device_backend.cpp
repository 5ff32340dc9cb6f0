#include "core/device_backend.h"

#include "core/error.h"

#if ROFORMER_CUDA
#include "core/cuda/backend.h"
#endif

namespace roformer {

namespace {
DeviceBackend* backend_of(DeviceType type) {
#if ROFORMER_CUDA
  if (type == DeviceType::cuda) return &cuda::backend();
#else
  (void)type;
#endif
  return nullptr;
}
}  // namespace

int device_count(DeviceType type) {
  if (type == DeviceType::cpu) return 1;
  DeviceBackend* backend = backend_of(type);
  return backend ? backend->device_count() : 0;
}

bool device_available(Device device) {
  if (device.is_cpu()) return device.index == 0;
  return device.index >= 0 && device.index < device_count(device.type);
}

DeviceBackend& backend_for(Device device) {
  RF_CHECK(!device.is_cpu(), "backend_for: the CPU has no device backend");
  DeviceBackend* backend = backend_of(device.type);
  RF_CHECK(backend, "device ", device.str(),
           " is not available: this build has no CUDA backend (configure with "
           "ROFORMER_WITH_CUDA=ON where nvcc is installed)");
  const int count = backend->device_count();
  RF_CHECK(device.index >= 0 && device.index < count, "device ", device.str(),
           " is not available: ", count, " ", backend->name(), " device",
           count == 1 ? " is" : "s are", " visible");
  return *backend;
}

void require_device(Device device) {
  if (device.is_cpu()) {
    RF_CHECK(device.index == 0, "device ", device.str(), " does not exist (the CPU is cpu)");
    return;
  }
  backend_for(device);  // no backend in this build, or not a visible device
#if !defined(ROFORMER_CUDA_KERNELS)
  throw Error("device " + device.str() +
              " has no kernels in this build (configure with ROFORMER_CUDA_KERNELS=ON)");
#endif
}

}  // namespace roformer
