#include "core/cpu/onednn.h"
#include "core/cpu/strided_loop.h"
#include "core/kernels/linear_weight_grads_shapes.h"

namespace roformer::kernels::cpu {

namespace {

struct MatmulPrimitive {
  dnnl::matmul primitive;
  dnnl::memory::desc a, b, bias, out;
};

// oneDNN wants broadcast batch dims as size 1, not stride 0. A size-1 dim's
// stride never moves the address, but oneDNN 2.6 matches it against its
// kernels' layouts: stride 0 there reads as an odd layout ("bca") and falls
// back to the reference kernel (~500x slower), so give it a plain outer stride.
dnnl::memory::desc operand_desc(const View& t) {
  Shape shape = t.shape(), strides = t.strides();
  for (int64_t d = 0; d + 2 < t.dim(); ++d)
    if (strides[d] == 0) shape[d] = 1;
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    if (shape[d] != 1) continue;
    int64_t outer = 1;
    for (int64_t e = d + 1; e < t.dim(); ++e) outer = std::max(outer, strides[e] * shape[e]);
    strides[d] = outer;
  }
  return onednn_desc(shape, strides, t.dtype());
}

// out = a b (+ bias), or with `accumulate` out += a b (oneDNN's sum post-op:
// the product's f32 result plus out's old value, rounded once into out).
void matmul_onednn(const View& a, const View& b, const View& bias, const View& out,
                   bool accumulate) {
  const std::string key = std::string(accumulate ? "matmul+=|" : "matmul|") + geometry_key(a) +
                          "|" + geometry_key(b) + "|" + geometry_key(bias) + "|" +
                          geometry_key(out);
  auto prim = cached_primitive<MatmulPrimitive>(key, [&] {
    count_primitive_built();
    MatmulPrimitive p;
    p.a = operand_desc(a);
    p.b = operand_desc(b);
    p.out = onednn_desc(out);
    if (bias.defined()) {
      dnnl::memory::dims bias_dims(size_t(out.dim()), 1);
      bias_dims.back() = out.shape().back();
      // The bias broadcasts over every dim but the last.
      dnnl::memory::dims st(bias_dims.size(), out.shape().back());
      st.back() = 1;
      p.bias = dnnl::memory::desc(bias_dims, onednn_dtype(bias.dtype()), st);
    }
    dnnl::matmul::desc desc = bias.defined() ? dnnl::matmul::desc(p.a, p.b, p.bias, p.out)
                                             : dnnl::matmul::desc(p.a, p.b, p.out);
    dnnl::primitive_attr attr;
    if (accumulate) {
      dnnl::post_ops sum_into_out;
      sum_into_out.append_sum(1.0f);
      attr.set_post_ops(sum_into_out);
    }
    dnnl::matmul::primitive_desc pd(desc, attr, onednn_engine());
    p.primitive = dnnl::matmul(pd);
    return p;
  });
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, onednn_memory(prim->a, a)},
                                             {DNNL_ARG_WEIGHTS, onednn_memory(prim->b, b)},
                                             {DNNL_ARG_DST, onednn_memory(prim->out, out)}};
  if (bias.defined()) args.emplace(DNNL_ARG_BIAS, onednn_memory(prim->bias, bias));
  prim->primitive.execute(onednn_stream(), args);
  onednn_stream().wait();
}

// Reference loop for f64 (oneDNN has no f64 matmul).
template <class T>
void matmul_loop(const View& a, const View& b, const View& bias, const View& out, bool accumulate) {
  const int64_t nd = out.dim();
  const int64_t M = out.shape()[nd - 2], N = out.shape()[nd - 1], K = a.shape()[nd - 1];
  const int64_t batches = out.numel() / std::max<int64_t>(M * N, 1);
  const T* pa = static_cast<const T*>(a.data());
  const T* pb = static_cast<const T*>(b.data());
  const T* pbias = bias.defined() ? static_cast<const T*>(bias.data()) : nullptr;
  T* po = static_cast<T*>(out.data());
  const int64_t sam = a.strides()[nd - 2], sak = a.strides()[nd - 1];
  const int64_t sbk = b.strides()[nd - 2], sbn = b.strides()[nd - 1];
  const int64_t som = out.strides()[nd - 2], son = out.strides()[nd - 1];
  parallel_rows(batches * M, N * K, [&](int64_t row) {
    const int64_t batch = row / M, m = row % M;
    int64_t oa = 0, ob = 0, oo = 0, rest = batch;
    for (int64_t d = nd - 3; d >= 0; --d) {
      const int64_t i = rest % out.shape()[d];
      rest /= out.shape()[d];
      oa += i * a.strides()[d];
      ob += i * b.strides()[d];
      oo += i * out.strides()[d];
    }
    for (int64_t n = 0; n < N; ++n) {
      double acc = pbias ? double(pbias[n * bias.strides().back()]) : 0.0;
      for (int64_t k = 0; k < K; ++k)
        acc += double(pa[oa + m * sam + k * sak]) * double(pb[ob + k * sbk + n * sbn]);
      T& o = po[oo + m * som + n * son];
      o = accumulate ? T(double(o) + acc) : T(acc);
    }
  });
}

// oneDNN's fast kernels want one unit stride in the matrix dims.
bool matrix_friendly(const View& t) {
  const int64_t nd = t.dim();
  return t.strides()[nd - 1] == 1 || t.strides()[nd - 2] == 1;
}

// out = a b (+ bias), or out += a b.
void product(Stream stream, KT a_kt, KT b_kt, KT bias_kt, KT out_kt, bool accumulate) {
  const View a_in(a_kt), b_in(b_kt), bias(bias_kt), out(out_kt);
  if (out.numel() == 0) return;
  if (a_in.shape().back() == 0) {  // empty sums; oneDNN would divide by K = 0 (SIGFPE)
    if (accumulate) return;
    if (bias.defined()) {
      Shape strides(out.shape().size(), 0);
      strides.back() = bias.strides().back();
      copy(stream, View(bias.data(), bias.dtype(), out.shape(), strides).kt(), out_kt);
    } else {
      fill(stream, out_kt, 0.0);
    }
    return;
  }
  if (a_in.dtype() == DType::f64) {
    matmul_loop<double>(a_in, b_in, bias, out, accumulate);
    return;
  }
  // Operands without a unit stride in the matrix dims go through a copy, and
  // so do bf16 ones (f32 copies) where oneDNN has no bf16 matmul
  // (onednn_has_bf16_matmul): then a bf16 out takes the f32 product (its old
  // values added when the product adds into it), rounded into it once, as
  // oneDNN's bf16 kernels round their f32 sums.
  const bool widen = !onednn_has_bf16_matmul();
  const auto gemm_dtype = [&](const View& t) {
    return widen && t.dtype() == DType::bf16 ? DType::f32 : t.dtype();
  };
  std::unique_ptr<Scratch> a_copy, b_copy, bias_copy, out_copy;
  const auto scratch_for = [&](const View& t, std::unique_ptr<Scratch>& keep) {
    keep = std::make_unique<Scratch>(t.shape(), gemm_dtype(t));
    return keep->view();
  };
  const auto copy_of = [&](const View& t, std::unique_ptr<Scratch>& keep) {
    const View c = scratch_for(t, keep);
    copy(stream, t.kt(), c.kt());
    return c;
  };
  const bool a_as_is = matrix_friendly(a_in) && gemm_dtype(a_in) == a_in.dtype();
  const bool b_as_is = matrix_friendly(b_in) && gemm_dtype(b_in) == b_in.dtype();
  const View a = a_as_is ? a_in : copy_of(a_in, a_copy);
  const View b = b_as_is ? b_in : copy_of(b_in, b_copy);
  const View bias_used =
      !bias.defined() || gemm_dtype(bias) == bias.dtype() ? bias : copy_of(bias, bias_copy);
  const View out_used = gemm_dtype(out) == out.dtype() ? out
                        : accumulate                   ? copy_of(out, out_copy)
                                                       : scratch_for(out, out_copy);
  matmul_onednn(a, b, bias_used, out_used, accumulate);
  if (out_copy) copy(stream, out_used.kt(), out_kt);
}

}  // namespace

void matmul(Stream stream, KT a, KT b, KT bias, KT out) {
  product(stream, a, b, bias, out, /*accumulate=*/false);
}

void matmul_accumulate(Stream stream, KT a, KT b, KT out) {
  product(stream, a, b, KernelTensor{}, out, /*accumulate=*/true);
}

void linear_weight_grads(Stream stream, KT g, KT x, KT dw, KT db, bool /*fused: CUDA only*/) {
  check_linear_weight_grads(g, x, dw, db);
  // Unfused here: the product, then the bias gradient as the sum kernel
  // gives it (the same bits as summing g over its rows on its own).
  matmul(stream, swapped(g, 0, 1), x, KernelTensor{}, dw);
  sum(stream, g, 1u, db);
}

}  // namespace roformer::kernels::cpu
