// report_first_bad (core/cuda/kernels/stream.cu) for the emulated kernels:
// stream.cu itself names DeviceType::cuda, which the namespace rename of
// kernel_emulation.h would break, and its other services need a device. As
// its write_first_bad kernel: the first bad position, unless the record
// already holds a report, goes to the stream's (host) error record.
#include "tests/simt/kernel_emulation.h"

namespace roformer::kernels::cuda {

void report_first_bad(const Stream& stream, int32_t site, const unsigned long long* first,
                      const KernelTensor& ids) {
  RF_CHECK(stream.error != nullptr, "simt: an emulated kernel's stream needs an error record");
  KernelError* record = stream.error;
  const unsigned long long position = *first;
  if (position == ~0ull || record->raised) return;
  const int64_t off = offset_of(ids, int64_t(position));
  record->raised = 1;
  record->site = site;
  record->position = int64_t(position);
  record->value = ids.dtype == DType::i32 ? int64_t(ids.as<const int32_t>()[off])
                                          : ids.as<const int64_t>()[off];
}

}  // namespace roformer::kernels::cuda
