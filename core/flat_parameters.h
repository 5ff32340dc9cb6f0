// Flat parameter and gradient memory. FlatParameters takes a set of leaf f32
// tensors and re-points each one's storage at a slice of one contiguous
// buffer (values are copied; every handle already held -- a layer's member,
// the tied MLM decoder -- sees the new memory, because handles share the
// TensorImpl). Gradients get persistent slices of a second buffer with the
// same layout, which backward accumulates into in place (GradSlot in
// core/autograd.h). Whole-model passes (AdamW, the gradient norm, zeroing)
// then run over two flat arrays, and a data-parallel reducer can reduce
// slices of the gradient buffer as each parameter's ready hook fires.
//
// It lives in core because both layers/ (Module::flatten_parameters) and
// optim/ (AdamW) use it, and it knows nothing of either: only tensors and
// the autograd slot.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/tensor.h"

namespace roformer {

class FlatParameters {
 public:
  // Each slice starts on a 64-byte boundary (16 floats) so kernels see
  // aligned weights; the padding between slices stays zero in both buffers.
  static constexpr int64_t kAlignment = 16;

  // Flattens `params` (in this order): distinct contiguous f32 leaf tensors on
  // one device, none sharing memory with another tensor (flatten before
  // taking views). Existing gradients are copied into the gradient buffer;
  // existing ready hooks are kept. Throws naming the offending tensor.
  static std::shared_ptr<FlatParameters> create(const std::vector<Tensor>& params);
  // The flat set holding exactly `params`, in this order; null otherwise.
  static std::shared_ptr<FlatParameters> of(const std::vector<Tensor>& params);
  // The flat set `t` is a slice of, or null.
  static std::shared_ptr<FlatParameters> owner_of(const Tensor& t);

  FlatParameters(const FlatParameters&) = delete;
  FlatParameters& operator=(const FlatParameters&) = delete;

  size_t size() const { return params_.size(); }
  const std::vector<Tensor>& parameters() const { return params_; }
  int64_t offset(size_t i) const { return offsets_[i]; }
  int64_t numel(size_t i) const { return params_[i].numel(); }
  int64_t padded_numel() const { return padded_; }    // length of both buffers
  int64_t num_elements() const { return elements_; }  // parameters' elements, no padding
  const Tensor& data() const { return data_; }        // f32 [padded_numel]
  const Tensor& grad() const { return grad_; }        // f32 [padded_numel]
  Device device() const { return data_.device(); }
  // Did parameter i receive a gradient since the last zero_grad?
  bool has_grad(size_t i) const { return params_[i].impl().grad != nullptr; }

  // One fill of the gradient buffer; every parameter's .grad becomes undefined.
  void zero_grad();
  // Calls hook(i) when parameter i's gradient is complete in a backward pass
  // (see GradSlot); an empty function removes the hooks.
  void set_grad_ready_hook(const std::function<void(size_t index)>& hook);
  // Moves both buffers to `device`; the parameters and their gradients follow.
  // Throws Tensor::to's error, leaving everything where it was, if there is
  // no copy path.
  void to(Device device);

  // A buffer with this layout packed to [num_elements] (padding dropped), and
  // back: optimizer moments are saved packed, in parameter order.
  Tensor pack(const Tensor& flat) const;
  void unpack(const Tensor& packed, const Tensor& flat) const;

 private:
  FlatParameters() = default;

  std::vector<Tensor> params_;
  std::vector<int64_t> offsets_;
  int64_t padded_ = 0, elements_ = 0;
  Tensor data_, grad_;
};

}  // namespace roformer
