#include "core/batch_upload.h"

#include "core/error.h"

namespace roformer {

BatchUploader::BatchUploader(Device device) : device_(device) {
  if (!device.is_cpu()) impl_ = backend_for(device).make_uploader(device.index);
}

BatchUploader::~BatchUploader() = default;

Tensor BatchUploader::upload(const Tensor& host) {
  RF_CHECK(host.device().is_cpu(), "BatchUploader::upload: expected a CPU tensor, got ",
           host.desc());
  const Tensor source = host.contiguous();
  if (!impl_) return source;
  Tensor out;
  {
    // The destination's block belongs to the side stream that writes it.
    StreamGuard on_side(impl_->stream());
    out = Tensor::empty(source.shape(), source.dtype(), device_);
  }
  impl_->upload(out.data(), source.data(), source.nbytes());
  unpublished_.push_back(out);
  return out;
}

void BatchUploader::publish() {
  if (impl_) impl_->publish(current_stream(device_));
  unpublished_.clear();
}

}  // namespace roformer
