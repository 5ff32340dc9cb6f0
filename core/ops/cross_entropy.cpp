// cross_entropy: fused log-softmax + NLL, mean over rows whose target is not
// ignore_index. Backward keeps the logits, the targets and one log-sum-exp per
// row, and recomputes softmax on the fly: no [N, C] probabilities are stored.
#include "core/cpu/cross_entropy.h"

#include "core/ops.h"

namespace roformer {

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  kernel_device("cross_entropy", {&logits, &targets});
  if (logits.dim() != 2 || !is_floating(logits.dtype()))
    throw Error(detail::concat("cross_entropy: expected floating logits [N, C], got ",
                               logits.desc(), " (targets ", targets.desc(), ")"));
  if (targets.dtype() != DType::i32 && targets.dtype() != DType::i64)
    throw Error(detail::concat("cross_entropy: targets must be i32 or i64, got ", targets.desc(),
                               " (logits ", logits.desc(), ")"));
  const int64_t rows = logits.shape()[0], classes = logits.shape()[1];
  if (targets.dim() != 1 || targets.shape()[0] != rows)
    throw Error(detail::concat("cross_entropy: targets ", targets.desc(), " do not match logits ",
                               logits.desc(), " (expected targets [", rows, "])"));
  const Tensor tc = targets.contiguous();
  const std::vector<int64_t> t = tc.to_vector<int64_t>();
  int64_t count = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (t[r] == ignore_index) continue;
    if (t[r] < 0 || t[r] >= classes)
      throw Error(detail::concat("cross_entropy: target ", t[r], " at row ", r,
                                 " is out of range for ", classes, " classes (logits ",
                                 logits.desc(), ", ignore_index ", ignore_index, ")"));
    ++count;
  }
  const Tensor xc = logits.detach().contiguous();
  Tensor lse = Tensor::empty({rows}, DType::f64, logits.device());
  double loss = 0.0;
  if (count > 0) {
    Tensor row_loss = Tensor::empty({rows}, DType::f64, logits.device());
    cpu::cross_entropy_forward(xc, tc, ignore_index, lse, row_loss);
    // Summed in row order, so the loss does not depend on the thread count.
    const double* pl = row_loss.data_as<double>();
    for (int64_t r = 0; r < rows; ++r) loss += pl[r];
    loss /= double(count);
  }
  Tensor out = Tensor::full({}, loss, logits.dtype(), logits.device());
  if (!needs_grad({&logits})) return out;
  const SavedTensor saved_logits(xc, "cross_entropy"), saved_targets(tc, "cross_entropy");
  return record("cross_entropy", out, {&logits}, [=](const Tensor& g) {
    const Tensor& x = saved_logits.get();
    const Tensor& tg = saved_targets.get();
    if (count == 0) return std::vector<Tensor>{Tensor::zeros(x.shape(), x.dtype(), x.device())};
    Tensor grad = Tensor::empty(x.shape(), x.dtype(), x.device());
    cpu::cross_entropy_backward(x, tg, ignore_index, lse, g.item() / double(count), grad);
    return std::vector<Tensor>{grad};
  });
}

}  // namespace roformer
