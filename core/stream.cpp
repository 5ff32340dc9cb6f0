#include "core/stream.h"

#include "core/device_backend.h"

namespace roformer {

Stream current_stream(Device device) {
  if (device.is_cpu()) return Stream{device, nullptr};
  return backend_for(device).current_stream(device.index);
}

void set_current_stream(const Stream& stream) {
  if (stream.device.is_cpu()) return;
  backend_for(stream.device).set_current_stream(stream);
}

StreamGuard::StreamGuard(const Stream& stream) : previous_(current_stream(stream.device)) {
  set_current_stream(stream);
}

StreamGuard::~StreamGuard() {
  // Restoring a stream that was current a moment ago cannot fail.
  set_current_stream(previous_);
}

void synchronize(const Stream& stream) {
  if (stream.device.is_cpu()) return;
  backend_for(stream.device).synchronize(stream);
}

}  // namespace roformer
