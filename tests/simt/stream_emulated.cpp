// report_first_bad (core/cuda/kernels/stream.cu) for the emulated kernels:
// stream.cu itself names DeviceType::cuda, which the namespace rename of
// kernel_emulation.h would break, and its other services need a device. It
// writes the stream's (host) error record as write_first_bad does.
#include "tests/simt/kernel_emulation.h"

namespace roformer::kernels::cuda {

void report_first_bad(const Stream& stream, int32_t site, const unsigned long long* first,
                      const KernelTensor& ids) {
  RF_CHECK(stream.error != nullptr, "simt: an emulated kernel's stream needs an error record");
  record_first_bad(stream.error, site, first, ids);
}

}  // namespace roformer::kernels::cuda
