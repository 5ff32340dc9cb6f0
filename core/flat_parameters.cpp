#include "core/flat_parameters.h"

#include <cstring>
#include <unordered_set>

#include "core/autograd.h"
#include "core/error.h"

namespace roformer {

namespace {
// Points `t`'s implementation at `storage` (every handle follows).
void rebind(TensorImpl& t, const std::shared_ptr<StorageImpl>& storage, int64_t offset) {
  t.storage = storage;
  t.offset = offset;
  t.strides = contiguous_strides(t.shape);
}
}  // namespace

std::shared_ptr<FlatParameters> FlatParameters::create(const std::vector<Tensor>& params) {
  std::shared_ptr<FlatParameters> flat(new FlatParameters());
  std::unordered_set<const TensorImpl*> seen;
  const Device device = params.empty() ? Device::cpu() : params.front().device();
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    auto fail = [&](const std::string& why) {
      throw Error(detail::concat("FlatParameters: parameter ", i, " (",
                                 p.defined() ? p.desc() : "undefined", ") ", why));
    };
    if (!p.defined()) fail("is undefined");
    if (p.dtype() != DType::f32 || !p.is_contiguous()) fail("must be a contiguous f32 tensor");
    if (!p.is_leaf()) fail("is not a leaf (it has history)");
    if (p.device() != device) fail("is on another device than parameter 0 (" + device.str() + ")");
    if (!seen.insert(&p.impl()).second) fail("is listed twice");
    if (owner_of(p)) fail("is already flat");
    // Views of the old memory would silently stop tracking the parameter.
    if (p.impl().storage.use_count() != 1 || p.offset() != 0)
      fail("shares its memory with another tensor; flatten before taking views of it");
    flat->offsets_.push_back(flat->padded_);
    flat->elements_ += p.numel();
    flat->padded_ += (p.numel() + kAlignment - 1) / kAlignment * kAlignment;
  }
  flat->params_ = params;
  flat->data_ = Tensor::zeros({flat->padded_}, DType::f32, device);
  flat->grad_ = Tensor::zeros({flat->padded_}, DType::f32, device);
  NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    TensorImpl& impl = params[i].impl();
    const int64_t offset = flat->offsets_[i];
    Tensor value = make_view(flat->data_, impl.shape, contiguous_strides(impl.shape), offset);
    value.copy_(params[i]);
    Tensor grad = make_view(flat->grad_, impl.shape, contiguous_strides(impl.shape), offset);
    if (impl.grad) {
      grad.copy_(Tensor(impl.grad));
      impl.grad = grad.impl_ptr();
    }
    rebind(impl, flat->data_.impl().storage, offset);
    if (!impl.grad_slot) impl.grad_slot = std::make_shared<GradSlot>();
    impl.grad_slot->buffer = grad;
    impl.grad_slot->owner = flat;
    impl.grad_slot->index = i;
  }
  return flat;
}

std::shared_ptr<FlatParameters> FlatParameters::owner_of(const Tensor& t) {
  if (!t.defined() || !t.impl().grad_slot) return nullptr;
  return t.impl().grad_slot->owner.lock();
}

std::shared_ptr<FlatParameters> FlatParameters::of(const std::vector<Tensor>& params) {
  if (params.empty()) return nullptr;
  std::shared_ptr<FlatParameters> flat = owner_of(params.front());
  if (!flat || flat->params_.size() != params.size()) return nullptr;
  for (size_t i = 0; i < params.size(); ++i)
    if (!params[i].defined() || params[i].impl_ptr() != flat->params_[i].impl_ptr()) return nullptr;
  return flat;
}

void FlatParameters::zero_grad() {
  if (grad_.device().is_cpu()) {
    std::memset(grad_.data(), 0, grad_.nbytes());
    grad_.bump_version();
  } else {
    grad_.zero_();
  }
  for (const Tensor& p : params_) p.impl().grad.reset();
}

void FlatParameters::set_grad_ready_hook(const std::function<void(size_t index)>& hook) {
  for (size_t i = 0; i < params_.size(); ++i) {
    std::function<void()> one;
    if (hook) one = [hook, i] { hook(i); };
    roformer::set_grad_ready_hook(params_[i], std::move(one));
  }
}

void FlatParameters::to(Device device) {
  if (device == data_.device()) return;
  // Both copies first: a failure leaves everything where it was.
  Tensor data = data_.to(device);
  Tensor grad = grad_.to(device);
  for (size_t i = 0; i < params_.size(); ++i) {
    TensorImpl& impl = params_[i].impl();
    rebind(impl, data.impl().storage, offsets_[i]);
    // .grad, when defined, is this same implementation: it follows.
    rebind(impl.grad_slot->buffer.impl(), grad.impl().storage, offsets_[i]);
  }
  data_ = std::move(data);
  grad_ = std::move(grad);
}

Tensor FlatParameters::pack(const Tensor& flat) const {
  if (flat.dim() != 1 || flat.numel() != padded_)
    throw Error(
        detail::concat("FlatParameters::pack: expected [", padded_, "], got ", flat.desc()));
  Tensor packed = Tensor::empty({elements_}, flat.dtype(), flat.device());
  NoGradGuard no_grad;
  int64_t at = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    const int64_t n = params_[i].numel();
    packed.narrow(0, at, n).copy_(flat.narrow(0, offsets_[i], n));
    at += n;
  }
  return packed;
}

void FlatParameters::unpack(const Tensor& packed, const Tensor& flat) const {
  if (packed.numel() != elements_ || flat.dim() != 1 || flat.numel() != padded_)
    throw InputError(detail::concat("FlatParameters::unpack: ", packed.desc(), " into ",
                                    flat.desc(), " does not fit ", elements_,
                                    " parameter elements"));
  NoGradGuard no_grad;
  const Tensor source = packed.reshape({elements_});
  int64_t at = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    const int64_t n = params_[i].numel();
    flat.narrow(0, offsets_[i], n).copy_(source.narrow(0, at, n));
    at += n;
  }
}

}  // namespace roformer
