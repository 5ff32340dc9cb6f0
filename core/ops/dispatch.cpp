// The dispatch point: device -> kernel table and stream; Tensor ->
// KernelTensor; the host side of kernel index checks (site descriptions, and
// raising a reported error at the sync point); the device-consistency check.
#include "core/ops/dispatch.h"

#include <array>
#include <atomic>
#include <mutex>
#include <string>

#include "core/ops.h"

namespace roformer {

namespace kernels {

std::atomic<uint64_t> kernel_calls_by_id[size_t(KernelId::count)];

uint64_t kernel_calls() {
  uint64_t total = 0;
  for (const auto& calls : kernel_calls_by_id) total += calls.load(std::memory_order_relaxed);
  return total;
}

const char* kernel_name(KernelId id) {
  static constexpr const char* kNames[] = {
#define ROFORMER_KERNEL_NAME(name, ...) #name,
      ROFORMER_KERNELS(ROFORMER_KERNEL_NAME)
#undef ROFORMER_KERNEL_NAME
  };
  return size_t(id) < size_t(KernelId::count) ? kNames[size_t(id)] : "?";
}

namespace {
std::atomic<const KernelTable*> g_cpu_table_for_tests{nullptr};
}  // namespace

void set_cpu_kernel_table_for_tests(const KernelTable* table) {
  g_cpu_table_for_tests.store(table, std::memory_order_release);
}

const KernelTable& table(Device device) {
  if (device.is_cpu()) {
    const KernelTable* replaced = g_cpu_table_for_tests.load(std::memory_order_acquire);
    return replaced ? *replaced : cpu_kernel_table;
  }
#if defined(ROFORMER_CUDA_KERNELS)
  if (device.is_cuda()) return cuda_kernel_table;
#endif
  throw Error(detail::concat("no kernels for device ", device.str(),
                             " in this build (CUDA kernels are built with ROFORMER_CUDA_KERNELS)"));
}

Stream stream(Device device) {
  if (device.is_cpu()) {
    // One synchronous stream; cached so a launch costs no call.
    static const Stream cpu_stream = cpu_kernel_table.default_stream(0);
    return cpu_stream;
  }
  return table(device).default_stream(device.index);
}

KernelTensor kernel_tensor(const Tensor& t) {
  KernelTensor k;
  if (!t.defined()) return k;
  const int64_t nd = t.dim();
  if (nd > kMaxDims)
    throw Error(
        detail::concat("kernel call: ", t.desc(), " has more than ", kMaxDims, " dimensions"));
  k.data = t.data();
  k.dtype = t.dtype();
  k.ndim = int32_t(nd);
  for (int64_t d = 0; d < nd; ++d) {
    k.sizes[d] = t.shape()[size_t(d)];
    k.strides[d] = t.strides()[size_t(d)];
  }
  return k;
}

namespace {

// Descriptions of recent index-checking calls, by site number. A site is
// read only if its kernel reported, at the next sync point; a ring this big
// outlives any step's worth of checks.
constexpr size_t kSites = 4096;
struct Sites {
  std::mutex mutex;
  std::array<IndexErrorMessage, kSites> messages;
  int32_t next = 0;
  // Device types with checks launched since the last read.
  std::atomic<bool> cpu_pending{false};
  std::atomic<uint64_t> cuda_pending{0};  // bit i: cuda:i
};
Sites& sites() {
  static Sites s;
  return s;
}

void raise_pending(Device device) {
  KernelError error;
  const KernelTable& t = table(device);
  t.take_error(stream(device), &error);
  if (!error.raised) return;
  IndexErrorMessage message;
  {
    Sites& s = sites();
    std::lock_guard<std::mutex> lock(s.mutex);
    message = s.messages[size_t(error.site) % kSites];
  }
  if (!message)
    throw Error(detail::concat("index ", error.value, " at position ", error.position,
                               " out of range (", device.str(), ")"));
  throw Error(message(error.value, error.position));
}

}  // namespace

int32_t index_check_site(Device device, IndexErrorMessage message) {
  Sites& s = sites();
  if (device.is_cpu()) {
    s.cpu_pending = true;
  } else {
    s.cuda_pending.fetch_or(uint64_t(1) << (device.index & 63));
  }
  std::lock_guard<std::mutex> lock(s.mutex);
  const int32_t site = s.next;
  s.messages[size_t(site) % kSites] = std::move(message);
  s.next = int32_t((size_t(site) + 1) % (kSites * 1024));
  return site;
}

}  // namespace kernels

void check_kernel_errors() {
  kernels::Sites& s = kernels::sites();
  if (s.cpu_pending.exchange(false)) kernels::raise_pending(Device::cpu());
  const uint64_t cuda = s.cuda_pending.exchange(0);
  for (int i = 0; i < 64; ++i)
    if (cuda >> i & 1) kernels::raise_pending(Device::cuda(i));
}

namespace {
// kernel_device over any range of tensor pointers (no copy of the list: it
// runs on every op call).
template <class Range>
Device device_of(const char* op, const Range& tensors) {
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
  if (!device.is_cpu()) {
    try {
      kernels::table(device);
    } catch (const Error& e) {
      throw Error(detail::concat(op, ": ", e.what()));
    }
  }
  return device;
}
}  // namespace

Device kernel_device(const char* op, std::initializer_list<const Tensor*> tensors) {
  return device_of(op, tensors);
}

Device kernel_device(const char* op, const std::vector<const Tensor*>& tensors) {
  return device_of(op, tensors);
}

}  // namespace roformer
