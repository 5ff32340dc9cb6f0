// Device checks shared by every op: a clear error instead of a crash when an
// op meets a device it has no kernel for, or tensors on different devices.
#include <mutex>
#include <set>
#include <string>

#include "core/ops.h"

namespace roformer {

namespace {
std::mutex g_mutex;
std::set<std::pair<std::string, DeviceType>>& registry() {
  static std::set<std::pair<std::string, DeviceType>> kernels;
  return kernels;
}
}  // namespace

void register_kernel(const char* op, DeviceType type) {
  std::lock_guard<std::mutex> lock(g_mutex);
  registry().emplace(op, type);
}

Device kernel_device(const char* op, std::initializer_list<const Tensor*> tensors) {
  const Tensor* first = nullptr;
  for (const Tensor* t : tensors) {
    if (!t || !t->defined()) continue;
    if (!first) {
      first = t;
    } else if (!(t->device() == first->device())) {
      throw Error(detail::concat(op, ": tensors on different devices: ", first->desc(), " and ",
                                 t->desc()));
    }
  }
  if (!first) throw Error(detail::concat(op, ": no defined input tensor"));
  const Device device = first->device();
  if (device.is_cpu()) return device;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!registry().count({op, device.type}))
    throw Error(detail::concat(op, ": no kernel for device ", device.str(), " (input ",
                               first->desc(), ")"));
  return device;
}

}  // namespace roformer
