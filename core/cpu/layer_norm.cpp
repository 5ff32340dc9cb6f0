#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/cpu/dropout_rows.h"
#include "core/cpu/onednn.h"
#include "core/cpu/strided_loop.h"
#include "core/kernels/layer_norm_dtypes.h"

namespace roformer::kernels::cpu {

namespace {

struct LayerNormPrimitives {
  dnnl::memory::desc data, stat, param;
  dnnl::layer_normalization_forward forward;
  dnnl::layer_normalization_backward backward;
  // oneDNN 2.6 rejects a use_shift backward without a SHIFT argument, though
  // no gradient depends on it: it gets these zeros instead of the bias.
  std::vector<float> zero_shift;
};

std::shared_ptr<LayerNormPrimitives> primitives(int64_t rows, int64_t cols, double eps, bool scale,
                                                bool shift) {
  uint32_t eps_bits;  // exact, not a rounded decimal: eps values must never share a primitive
  const float eps_f = float(eps);
  std::memcpy(&eps_bits, &eps_f, 4);
  const std::string key =
      detail::concat("layer_norm|f32|", rows, ',', cols, '|', eps_bits, '|', scale, shift);
  return cached_primitive<LayerNormPrimitives>(key, [&] {
    count_primitive_built();
    LayerNormPrimitives p;
    p.data = onednn_desc({rows, cols}, {cols, 1}, DType::f32);
    p.stat = onednn_desc({rows}, {1}, DType::f32);
    p.param = onednn_desc({cols}, {1}, DType::f32);
    auto flags = dnnl::normalization_flags::none;
    if (scale) flags |= dnnl::normalization_flags::use_scale;
    if (shift) flags |= dnnl::normalization_flags::use_shift;
    const dnnl::engine& engine = onednn_engine();
    // forward_training writes mean and variance for the backward to reuse.
    dnnl::layer_normalization_forward::primitive_desc fwd(
        {dnnl::prop_kind::forward_training, p.data, p.stat, float(eps), flags}, engine);
    dnnl::layer_normalization_backward::primitive_desc bwd(
        {dnnl::prop_kind::backward, p.data, p.data, p.stat, float(eps), flags}, engine, fwd);
    p.forward = dnnl::layer_normalization_forward(fwd);
    p.backward = dnnl::layer_normalization_backward(bwd);
    if (shift) p.zero_shift.assign(size_t(cols), 0.0f);
    return p;
  });
}

void execute(const dnnl::primitive& prim, const std::unordered_map<int, dnnl::memory>& args) {
  prim.execute(onednn_stream(), args);
  onednn_stream().wait();
}

template <class T>
void forward_loop(const View& x, const View& weight, const View& bias, double eps, const View& y,
                  const View& mean, const View& var) {
  using A = acc_t<T>;
  const int64_t cols = x.shape().back(), rows = x.numel() / cols;
  const T* px = static_cast<const T*>(x.data());
  const T* pw = weight.defined() ? static_cast<const T*>(weight.data()) : nullptr;
  const T* pb = bias.defined() ? static_cast<const T*>(bias.data()) : nullptr;
  T* py = static_cast<T*>(y.data());
  A* pm = static_cast<A*>(mean.data());
  A* pv = static_cast<A*>(var.data());
  parallel_rows(rows, cols, [&](int64_t r) {
    const T* xr = px + r * cols;
    T* yr = py + r * cols;
    A m = 0;
    for (int64_t c = 0; c < cols; ++c) m += A(xr[c]);
    m /= A(cols);
    A v = 0;
    for (int64_t c = 0; c < cols; ++c) v += (A(xr[c]) - m) * (A(xr[c]) - m);
    v /= A(cols);
    const A rstd = A(1) / std::sqrt(v + A(eps));
    for (int64_t c = 0; c < cols; ++c) {
      A out = (A(xr[c]) - m) * rstd;
      if (pw) out *= A(pw[c]);
      if (pb) out += A(pb[c]);
      yr[c] = T(out);
    }
    pm[r] = m;
    pv[r] = v;
  });
}

template <class T>
void backward_loop(const View& x, const View& weight, const View& mean, const View& var,
                   const View& dy, double eps, const View& dx, const View& dweight,
                   const View& dbias) {
  using A = acc_t<T>;
  const int64_t cols = x.shape().back(), rows = x.numel() / cols;
  const T* px = static_cast<const T*>(x.data());
  const T* pw = weight.defined() ? static_cast<const T*>(weight.data()) : nullptr;
  const T* pg = static_cast<const T*>(dy.data());
  const A* pm = static_cast<const A*>(mean.data());
  const A* pv = static_cast<const A*>(var.data());
  T* pdx = static_cast<T*>(dx.data());
  std::vector<A> rstd(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) rstd[r] = A(1) / std::sqrt(pv[r] + A(eps));
  // dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)), gw = dy * weight.
  parallel_rows(rows, cols, [&](int64_t r) {
    const T* xr = px + r * cols;
    const T* gr = pg + r * cols;
    A sum_g = 0, sum_gx = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const A gw = A(gr[c]) * (pw ? A(pw[c]) : A(1));
      sum_g += gw;
      sum_gx += gw * (A(xr[c]) - pm[r]) * rstd[r];
    }
    sum_g /= A(cols);
    sum_gx /= A(cols);
    for (int64_t c = 0; c < cols; ++c) {
      const A gw = A(gr[c]) * (pw ? A(pw[c]) : A(1));
      const A xhat = (A(xr[c]) - pm[r]) * rstd[r];
      pdx[r * cols + c] = T(rstd[r] * (gw - sum_g - xhat * sum_gx));
    }
  });
  if (!dweight.defined() && !dbias.defined()) return;
  // Column sums over rows, each column summed in row order: parallel over
  // column blocks so the result does not depend on the thread count.
  T* pdw = dweight.defined() ? static_cast<T*>(dweight.data()) : nullptr;
  T* pdb = dbias.defined() ? static_cast<T*>(dbias.data()) : nullptr;
  constexpr int64_t kBlock = 64;
  const int64_t blocks = (cols + kBlock - 1) / kBlock;
  parallel_rows(blocks, rows * kBlock, [&](int64_t b) {
    const int64_t c0 = b * kBlock, c1 = std::min(cols, c0 + kBlock);
    A sw[kBlock] = {}, sb[kBlock] = {};
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = c0; c < c1; ++c) {
        const A g = A(pg[r * cols + c]);
        sw[c - c0] += g * (A(px[r * cols + c]) - pm[r]) * rstd[r];
        sb[c - c0] += g;
      }
    for (int64_t c = c0; c < c1; ++c) {
      if (pdw) pdw[c] = T(sw[c - c0]);
      if (pdb) pdb[c] = T(sb[c - c0]);
    }
  });
}

}  // namespace

void layer_norm_forward(Stream stream, KT x_kt, KT residual_kt, KT weight_kt, KT bias_kt,
                        double eps, const ResidualDropout& drop, KT drop_tokens, KT y_kt,
                        KT y_low_kt, KT sum_kt, KT mean_kt, KT var_kt) {
  const View weight(weight_kt), bias(bias_kt), y(y_kt), mean(mean_kt), var(var_kt);
  check_layer_norm_forward_dtypes(x_kt, residual_kt, weight_kt, bias_kt, y_kt, sum_kt, mean_kt,
                                  var_kt);
  check_residual_dropout("layer_norm_forward", x_kt, drop, drop_tokens, residual_kt);
  check_layer_norm_y_low(y_kt, y_low_kt);
  if (View(x_kt).numel() == 0) return;
  // The sum by add()'s own kernel: the fused op gives the unfused pair's bits.
  // bf16 x with an f32 residual is first cast into the sum (exact), then the
  // residual added in place (binary reads each element before writing it).
  // A residual dropout makes the sum in one pass of dropout's own draws and
  // roundings (dropout_add_rows): the same bits again.
  if (drop.p > 0.0) {
    dropout_add_rows(View(x_kt), View(residual_kt), View(sum_kt), drop.p, drop.key,
                     View(drop_tokens), drop.positions);
  } else if (layer_norm_mixed_residual(x_kt, residual_kt)) {
    copy(stream, x_kt, sum_kt);
    binary(stream, BinaryOp::add, sum_kt, residual_kt, sum_kt);
  } else if (residual_kt.defined()) {
    binary(stream, BinaryOp::add, x_kt, residual_kt, sum_kt);
  }
  // With a residual the rows normalised are the sum's.
  const View x(residual_kt.defined() ? sum_kt : x_kt);
  if (x.dtype() == DType::f32) {
    const int64_t cols = x.shape().back(), rows = x.numel() / cols;
    auto p = primitives(rows, cols, eps, weight.defined(), bias.defined());
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, onednn_memory(p->data, x)},
                                               {DNNL_ARG_DST, onednn_memory(p->data, y)},
                                               {DNNL_ARG_MEAN, onednn_memory(p->stat, mean)},
                                               {DNNL_ARG_VARIANCE, onednn_memory(p->stat, var)}};
    if (weight.defined()) args.emplace(DNNL_ARG_SCALE, onednn_memory(p->param, weight));
    if (bias.defined()) args.emplace(DNNL_ARG_SHIFT, onednn_memory(p->param, bias));
    execute(p->forward, args);
    // The cast kernel's rounding: the bits a later cast of y would give.
    if (y_low_kt.defined()) copy(stream, y_kt, y_low_kt);
    return;
  }
  dispatch_floating(x.dtype(), "layer_norm", [&](auto tag) {
    forward_loop<decltype(tag)>(x, weight, bias, eps, y, mean, var);
  });
}

namespace {

// dx (and the parameters' gradients): oneDNN for f32, loops otherwise.
void backward_f32_or_loop(Stream stream, KT x_kt, KT weight_kt, KT mean_kt, KT var_kt, KT dy_kt,
                          double eps, KT dx_kt, KT dweight_kt, KT dbias_kt) {
  const View x(x_kt), weight(weight_kt), mean(mean_kt), var(var_kt), dy(dy_kt), dx(dx_kt),
      dweight(dweight_kt), dbias(dbias_kt);
  if (x.numel() == 0) {
    for (KT t : {dweight_kt, dbias_kt})
      if (t.defined()) fill(stream, t, 0.0);
    return;
  }
  if (x.dtype() == DType::f32) {
    const int64_t cols = x.shape().back(), rows = x.numel() / cols;
    // The primitive's flags follow the forward's (weight given = use_scale);
    // a shift gradient is always computed when the forward had a bias.
    const bool shift = dbias.defined();
    auto p = primitives(rows, cols, eps, weight.defined(), shift);
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, onednn_memory(p->data, x)},
                                               {DNNL_ARG_DIFF_DST, onednn_memory(p->data, dy)},
                                               {DNNL_ARG_DIFF_SRC, onednn_memory(p->data, dx)},
                                               {DNNL_ARG_MEAN, onednn_memory(p->stat, mean)},
                                               {DNNL_ARG_VARIANCE, onednn_memory(p->stat, var)}};
    std::unique_ptr<Scratch> scratch_dw;  // oneDNN wants a scale gradient buffer
    if (weight.defined()) {
      args.emplace(DNNL_ARG_SCALE, onednn_memory(p->param, weight));
      if (!dweight.defined()) scratch_dw = std::make_unique<Scratch>(Shape{cols}, DType::f32);
      args.emplace(DNNL_ARG_DIFF_SCALE,
                   onednn_memory(p->param, dweight.defined() ? dweight : scratch_dw->view()));
    }
    if (shift) {
      args.emplace(DNNL_ARG_SHIFT, dnnl::memory(p->param, onednn_engine(), p->zero_shift.data()));
      args.emplace(DNNL_ARG_DIFF_SHIFT, onednn_memory(p->param, dbias));
    }
    execute(p->backward, args);
    return;
  }
  dispatch_floating(x.dtype(), "layer_norm", [&](auto tag) {
    backward_loop<decltype(tag)>(x, weight, mean, var, dy, eps, dx, dweight, dbias);
  });
}
}  // namespace

void layer_norm_backward(Stream stream, KT x_kt, KT weight_kt, KT mean_kt, KT var_kt, KT dy_kt,
                         double eps, const ResidualDropout& drop, KT drop_tokens, KT dx_kt,
                         KT dx_x_kt, KT dweight_kt, KT dbias_kt) {
  check_layer_norm_x_grad(dx_kt, dx_x_kt);
  check_residual_dropout("layer_norm_backward", x_kt, drop, drop_tokens, dx_x_kt);
  backward_f32_or_loop(stream, x_kt, weight_kt, mean_kt, var_kt, dy_kt, eps, dx_kt, dweight_kt,
                       dbias_kt);
  if (!dx_x_kt.defined() || dx_kt.numel() == 0) return;
  // x's gradient as the unfused ops make it: the cast kernel's rounding, then
  // dropout's backward (the same mask again), in one pass.
  if (!(drop.p > 0.0)) return copy(stream, dx_kt, dx_x_kt);
  dropout_rows(View(dx_kt), View(dx_x_kt), drop.p, drop.key, View(drop_tokens), drop.positions);
}

}  // namespace roformer::kernels::cpu
