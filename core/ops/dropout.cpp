// dropout: the mask is never stored. Forward takes the next site key from the
// context; backward regenerates the same mask from it, so the node keeps a
// key instead of a mask tensor.
#include "core/ops.h"
#include "core/ops/dispatch.h"
#include "core/ops/dropout_checks.h"

namespace roformer {

void check_dropout_arguments(const char* op, const Tensor& x, double p, const Tensor& tokens) {
  if (!(p >= 0.0 && p < 1.0))
    throw Error(detail::concat(op, ": p must be in [0, 1), got ", p, " for ", x.desc()));
  if (tokens.defined() && (x.dim() < 1 || tokens.dim() != 2 || tokens.size(0) != x.size(0) ||
                           tokens.size(1) != 2 || tokens.dtype() != DType::i64))
    throw Error(detail::concat(op, ": expected tokens [T, 2] i64 for x [T, ...], got x ", x.desc(),
                               " and tokens ", tokens.desc()));
}

Tensor dropout(const Tensor& x, double p, bool training, DropoutContext& ctx) {
  const Device device = kernel_device("dropout", {&x});
  if (!is_floating(x.dtype()))
    throw Error(detail::concat("dropout: expected a floating tensor, got ", x.desc()));
  check_dropout_arguments("dropout", x, p, Tensor());
  // Identity takes no site, so evaluation leaves the context untouched.
  if (!training || p == 0.0) return x;
  const DropoutKey key = ctx.next_site_key();
  // [rows, positions, features]: [B, S, ...] for dim >= 3, [B, F] as one
  // position per row, a vector as one row.
  const int64_t rows = x.dim() >= 2 ? x.size(0) : 1;
  const int64_t positions = x.dim() >= 3 ? x.size(1) : 1;
  const int64_t features = rows * positions > 0 ? x.numel() / (rows * positions) : 0;
  const Tensor xc = x.detach().contiguous();
  Tensor out = Tensor::empty(x.shape(), x.dtype(), device);
  const Shape tokens{rows, positions, features};
  launch::dropout(device, xc.view(tokens), out.view(tokens), p, key);
  return record("dropout", out, {&x}, [=](const Tensor& g) {
    const Tensor gc = g.contiguous();
    Tensor dx = Tensor::empty(gc.shape(), gc.dtype(), gc.device());
    launch::dropout(gc.device(), gc.view(tokens), dx.view(tokens), p, key);
    return std::vector<Tensor>{dx};
  });
}

Tensor dropout(const Tensor& x, double p, bool training, DropoutContext& ctx,
               const Tensor& tokens) {
  const Device device = kernel_device("dropout", {&x, &tokens});
  if (!is_floating(x.dtype()))
    throw Error(detail::concat("dropout: expected a floating tensor, got ", x.desc()));
  if (!tokens.defined())
    throw Error(detail::concat("dropout: expected tokens [T, 2] i64 for x [T, ...], got x ",
                               x.desc(), " and undefined tokens"));
  check_dropout_arguments("dropout", x, p, tokens);
  if (!training || p == 0.0) return x;
  const DropoutKey key = ctx.next_site_key();
  const int64_t T = x.size(0), features = T > 0 ? x.numel() / T : 0;
  const Shape flat{T, features};
  const Tensor xc = x.detach().contiguous();
  const Tensor ids = tokens.detach().contiguous();
  Tensor out = Tensor::empty(x.shape(), x.dtype(), device);
  launch::dropout_tokens(device, xc.view(flat), out.view(flat), ids, p, key);
  return record("dropout", out, {&x}, [=](const Tensor& g) {
    const Tensor gc = g.contiguous();
    Tensor dx = Tensor::empty(gc.shape(), gc.dtype(), gc.device());
    launch::dropout_tokens(gc.device(), gc.view(flat), dx.view(flat), ids, p, key);
    return std::vector<Tensor>{dx};
  });
}

}  // namespace roformer
