// cross_entropy: fused log-softmax + NLL, mean over rows whose target is not
// ignore_index, with the rows counted and those whose argmax is the target
// (the MLM accuracy, from the same pass over the logits). Backward keeps the
// logits, the targets and one log-sum-exp per row, and recomputes softmax on
// the fly: no [N, C] probabilities are stored. Nothing is read on the host:
// the loss and both counts are device tensors, and a bad target is raised at
// the next sync point.
#include "core/ops.h"
#include "core/ops/dispatch.h"

namespace roformer {

CrossEntropyOutputs cross_entropy_with_counts(const Tensor& logits, const Tensor& targets,
                                              int64_t ignore_index) {
  const Device device = kernel_device("cross_entropy", {&logits, &targets});
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
  const int32_t site = kernels::index_check_site(
      device, [classes, ignore_index, logits_desc = logits.desc()](int64_t value, int64_t row) {
        return detail::concat("cross_entropy: target ", value, " at row ", row,
                              " is out of range for ", classes, " classes (logits ", logits_desc,
                              ", ignore_index ", ignore_index, ")");
      });
  const Tensor tc = targets.contiguous();
  const Tensor xc = logits.detach().contiguous();
  // The loss is f32 for f32/bf16 logits (a bf16 loss would round away the
  // digits training curves are read in), f64 for f64.
  const DType loss_dtype = logits.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor lse = Tensor::empty({rows}, DType::f64, device);
  Tensor row_loss = Tensor::empty({rows}, DType::f64, device);
  Tensor out = Tensor::empty({}, loss_dtype, device);
  Tensor count = Tensor::empty({}, DType::i64, device);
  Tensor correct = Tensor::empty({}, DType::i64, device);
  launch::cross_entropy_forward(device, xc, tc, ignore_index, site, lse, row_loss, out, count,
                                correct);
  if (!needs_grad({&logits})) return {out, count, correct};
  const SavedTensor saved_logits(xc, "cross_entropy"), saved_targets(tc, "cross_entropy");
  const DType logits_dtype = logits.dtype();
  out = record("cross_entropy", out, {&logits}, [=](const Tensor& g) {
    const Tensor& x = saved_logits.get();
    Tensor grad = Tensor::empty(x.shape(), logits_dtype, x.device());
    launch::cross_entropy_backward(x.device(), x, saved_targets.get(), ignore_index, lse,
                                   g.contiguous(), count, grad);
    return std::vector<Tensor>{grad};
  });
  return {out, count, correct};
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  return cross_entropy_with_counts(logits, targets, ignore_index).loss;
}

}  // namespace roformer
