// The CPU's device services: one synchronous stream whose error record is a
// process-wide host struct.
#include <atomic>
#include <mutex>

#include "core/cpu/view.h"

namespace roformer::kernels::cpu {

namespace {
std::mutex g_error_mutex;
KernelError g_error;
}  // namespace

Stream default_stream(int device_index) {
  Stream s;
  s.device_type = DeviceType::cpu;
  s.device_index = device_index;
  s.error = &g_error;
  return s;
}

void take_error(Stream stream, KernelError* host) {
  std::lock_guard<std::mutex> lock(g_error_mutex);
  KernelError* record = stream.error ? stream.error : &g_error;
  *host = *record;
  *record = KernelError{};
}

void synchronize(Stream) {}  // CPU kernels finish before they return

void report_index_error(const Stream& stream, int32_t site, int64_t position, int64_t value) {
  std::lock_guard<std::mutex> lock(g_error_mutex);
  KernelError* record = stream.error ? stream.error : &g_error;
  if (record->raised) return;
  record->raised = 1;
  record->site = site;
  record->position = position;
  record->value = value;
}

}  // namespace roformer::kernels::cpu
