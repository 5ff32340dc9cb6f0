// What a device type provides to the tensor core: memory (one allocator per
// device index), copies to and from the host, and streams. The CPU needs none;
// the CUDA backend (core/cuda/) implements it. Kernels are reached through the
// kernel list, not through this interface.
//
// Read by nvcc too: C++17 only.
#pragma once

#include <cstddef>
#include <memory>

#include "core/allocator.h"
#include "core/device.h"
#include "core/stream.h"

namespace roformer {

// Host-to-device copies on a side stream through pinned staging memory, so a
// batch uploads while the compute stream works on the previous one.
class HostUploader {
 public:
  virtual ~HostUploader() = default;
  // The side stream: allocate upload destinations while it is current, so
  // their blocks belong to it.
  virtual Stream stream() const = 0;
  // Stages `nbytes` of host memory in pinned memory (returns once staged) and
  // queues its copy into `dst` on the side stream.
  virtual void upload(void* dst, const void* src, size_t nbytes) = 0;
  // Makes `consumer` wait (on the device) for every upload queued so far and
  // keeps their blocks from reuse until the consumer's work on them is done.
  virtual void publish(const Stream& consumer) = 0;
};

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  virtual const char* name() const = 0;
  virtual int device_count() const = 0;
  // The allocator of device `index` (0 <= index < device_count()).
  virtual Allocator& allocator(int index) = 0;
  virtual Stream current_stream(int index) = 0;
  virtual void set_current_stream(const Stream& stream) = 0;
  virtual void synchronize(const Stream& stream) = 0;
  // Copies `nbytes` contiguous bytes, ordered on `stream` (a device of this
  // backend). Either side may be host memory (Device::cpu()). A copy to the
  // host has arrived when this returns; other copies are asynchronous.
  virtual void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device,
                          size_t nbytes, const Stream& stream) = 0;
  virtual std::unique_ptr<HostUploader> make_uploader(int index) = 0;
};

// The backend of a device type in this build; throws an Error naming the
// device when the build lacks it or the index is not a visible device.
DeviceBackend& backend_for(Device device);

// Whether `device` can hold tensors in this build on this machine.
bool device_available(Device device);

// Number of visible devices of `type` (1 for the CPU, 0 without a backend).
int device_count(DeviceType type);

// Throws an Error saying why ops cannot run on `device` here: the build has
// no backend for it, or no kernels for it (ROFORMER_CUDA_KERNELS off), or the
// machine shows no such device. Returns when they can.
void require_device(Device device);

}  // namespace roformer
