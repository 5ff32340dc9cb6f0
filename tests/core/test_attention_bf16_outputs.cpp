// bf16 outputs of the CPU attention kernels (padded, token stream, RoPE
// inside): with bf16 q, k, v the kernels write out, and the gradients of q,
// k, v, in bf16 as the f32 results rounded once -- bit for bit what the
// f32-output call gives, rounded -- forward and backward, with and without
// dropout, with a key mask, odd head dims and lengths, strided outputs, on
// one thread against the default count. Other dtype mixes are rejected
// naming the dtypes.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/ops.h"
#include "core/ops/dispatch.h"
#include "core/ops/rope_table.h"
#include "gradcheck.h"
#include "tests/test_support.h"

namespace roformer {
namespace {

using testing::error_of;
using testing::random_f64;

#define EXPECT_MENTIONS(msg, text) \
  EXPECT_NE((msg).find(text), std::string::npos) << "'" << (text) << "' missing from: " << (msg)

// The bits of a bf16 tensor, and of an f32 tensor rounded to bf16 (once,
// round-to-nearest-even, as bf16(float) does).
std::vector<uint16_t> bf16_bits(const Tensor& t) {
  const Tensor c = t.contiguous();
  const bf16* p = c.data_as<bf16>();
  std::vector<uint16_t> bits;
  for (int64_t i = 0; i < c.numel(); ++i) bits.push_back(p[i].bits);
  return bits;
}
std::vector<uint16_t> rounded_bits(const Tensor& f32) {
  std::vector<uint16_t> bits;
  for (float x : f32.to_vector<float>()) bits.push_back(bf16(x).bits);
  return bits;
}

bool any_nonzero(const Tensor& t) {
  for (float x : t.to_vector<float>())
    if (x != 0.0f) return true;
  return false;
}

// One kernel under test: its bf16 inputs and how to call it.
struct Kernel {
  std::string name;
  Tensor q, k, v, mask_or_segments;
  Tensor table;  // defined: RoPE inside
  Shape lse_shape, bits_shape;
  kernels::AttentionParams params;

  Shape out_shape() const {
    Shape s = q.shape();
    s.back() = v.size(-1);
    return s;
  }
  void forward(const Tensor& out, const Tensor& lse, const Tensor& bits) const {
    if (table.defined()) {
      launch::rope_attention_forward(Device::cpu(), params, table, false, q, k, v, mask_or_segments,
                                     out, lse, bits);
    } else if (q.dim() == 3) {
      launch::attention_varlen_forward(Device::cpu(), params, q, k, v, mask_or_segments, out, lse,
                                       bits);
    } else {
      launch::attention_forward(Device::cpu(), params, q, k, v, mask_or_segments, out, lse, bits);
    }
  }
  void backward(const Tensor& out, const Tensor& lse, const Tensor& bits, const Tensor& grad_out,
                const Tensor& dq, const Tensor& dk, const Tensor& dv) const {
    if (table.defined()) {
      launch::rope_attention_backward(Device::cpu(), params, table, false,
                                      kernels::RopeInputs::unrotated, q, k, v, mask_or_segments,
                                      out, lse, bits, grad_out, dq, dk, dv);
    } else if (q.dim() == 3) {
      launch::attention_varlen_backward(Device::cpu(), params, q, k, v, mask_or_segments, out, lse,
                                        bits, grad_out, dq, dk, dv);
    } else {
      launch::attention_backward(Device::cpu(), params, q, k, v, mask_or_segments, out, lse, bits,
                                 grad_out, dq, dk, dv);
    }
  }
};

Tensor bf16_input(const Shape& shape, uint64_t seed) {
  return random_f64(shape, seed, -2.0, 2.0).to(DType::bf16);
}

// Padded [B, H, S, D]: odd lengths and head dims, Sq != Sk, batch row 1
// attending to its first 8 keys only.
Kernel padded(bool rope) {
  const int64_t B = 2, H = 3, Sq = rope ? 13 : 11, Sk = 13, D = rope ? 6 : 5, Dv = rope ? 6 : 7;
  Kernel kn;
  kn.name = rope ? "padded, RoPE inside" : "padded";
  kn.q = bf16_input({B, H, Sq, D}, 11);
  kn.k = bf16_input({B, H, Sk, D}, 12);
  kn.v = bf16_input({B, H, Sk, Dv}, 13);
  std::vector<int32_t> mask(size_t(B * Sk), 1);
  for (int64_t j = 8; j < Sk; ++j) mask[size_t(Sk + j)] = 0;
  kn.mask_or_segments = Tensor::from_vector(mask, {B, Sk});
  if (rope) kn.table = rope_table(Tensor::arange(0, Sq), D, 10000.0, DType::f32);
  kn.lse_shape = {B, H, Sq};
  kn.bits_shape = {B, H, Sq, 1};
  return kn;
}

// A token stream [T, H, D]: segments of odd lengths in two rows, token 20 in
// no segment.
Kernel token_stream(bool rope) {
  const int64_t T = 41, H = 2, D = rope ? 6 : 5, Dv = rope ? 6 : 3;
  Kernel kn;
  kn.name = rope ? "token stream, RoPE inside" : "token stream";
  kn.q = bf16_input({T, H, D}, 21);
  kn.k = bf16_input({T, H, D}, 22);
  kn.v = bf16_input({T, H, Dv}, 23);
  // (first token, length, row, position of the first token in its row)
  const std::vector<int64_t> segs{0, 7, 0, 0, 7, 13, 0, 7, 21, 1, 1, 0, 22, 19, 1, 1};
  kn.mask_or_segments = Tensor::from_vector(segs, {4, 4});
  std::vector<int64_t> positions(size_t(T), 0);
  for (size_t n = 0; n < segs.size(); n += 4)
    for (int64_t i = 0; i < segs[n + 1]; ++i) positions[size_t(segs[n] + i)] = segs[n + 3] + i;
  if (rope) kn.table = rope_table(Tensor::from_vector(positions, {T}), D, 10000.0, DType::f32);
  kn.lse_shape = {T, H};
  kn.bits_shape = {T, H, 1};
  kn.params.longest_segment = 19;
  return kn;
}

// A bf16 tensor of `shape` that is not contiguous where the kernels allow
// it: a padded [B, H, S, D] seen through [B, S, H, D] storage.
Tensor strided_bf16(const Shape& shape) {
  if (shape.size() != 4) return Tensor::zeros(shape, DType::bf16);
  return Tensor::zeros({shape[0], shape[2], shape[1], shape[3]}, DType::bf16).transpose(1, 2);
}

// Runs f with OpenMP on one thread (the f32 reference runs on the default
// count: the bf16 results must not depend on it either).
void on_one_thread(const std::function<void()>& f) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  f();
  omp_set_num_threads(saved);
}

TEST(AttentionBf16Outputs, AreTheF32OutputsRoundedOnceBitForBit) {
  for (const Kernel& base : {padded(false), token_stream(false), padded(true), token_stream(true)})
    for (const double p : {0.0, 0.2}) {
      Kernel kn = base;
      kn.params.scale = 0.4;
      kn.params.dropout_p = p;
      kn.params.dropout = DropoutKey{5, 3, 2, 1};
      SCOPED_TRACE(kn.name + (p > 0 ? ", dropout" : ""));
      const Shape os = kn.out_shape();
      auto bits = [&] { return p > 0 ? Tensor::zeros(kn.bits_shape, DType::i32) : Tensor(); };
      // Tokens in no segment are not written: both calls start from zeros.
      const Tensor out32 = Tensor::zeros(os), lse32 = Tensor::zeros(kn.lse_shape), bits32 = bits();
      kn.forward(out32, lse32, bits32);
      const Tensor out16 = strided_bf16(os), lse16 = Tensor::zeros(kn.lse_shape), bits16 = bits();
      on_one_thread([&] { kn.forward(out16, lse16, bits16); });
      ASSERT_TRUE(any_nonzero(out32));
      EXPECT_EQ(bf16_bits(out16), rounded_bits(out32));
      EXPECT_EQ(lse16.to_vector<float>(), lse32.to_vector<float>());
      if (p > 0) {
        EXPECT_EQ(bits16.to_vector<int32_t>(), bits32.to_vector<int32_t>());
      }

      const Tensor grad_out = bf16_input(os, 31);
      // The backward reads the forward's bf16 output for either gradient dtype.
      for (const Tensor& out : {out16}) {
        SCOPED_TRACE(std::string("out ") + dtype_name(out.dtype()));
        const Tensor dq32 = Tensor::zeros(kn.q.shape()), dk32 = Tensor::zeros(kn.k.shape()),
                     dv32 = Tensor::zeros(kn.v.shape());
        kn.backward(out, lse32, bits32, grad_out, dq32, dk32, dv32);
        const Tensor dq16 = strided_bf16(kn.q.shape()), dk16 = strided_bf16(kn.k.shape()),
                     dv16 = strided_bf16(kn.v.shape());
        on_one_thread([&] { kn.backward(out, lse16, bits16, grad_out, dq16, dk16, dv16); });
        ASSERT_TRUE(any_nonzero(dq32) && any_nonzero(dk32) && any_nonzero(dv32));
        EXPECT_EQ(bf16_bits(dq16), rounded_bits(dq32));
        EXPECT_EQ(bf16_bits(dk16), rounded_bits(dk32));
        EXPECT_EQ(bf16_bits(dv16), rounded_bits(dv32));
      }
    }
}

TEST(AttentionBf16Outputs, OtherDtypeMixesAreRejectedNamingTheDtypes) {
  for (const Kernel& kn : {padded(false), token_stream(false), padded(true), token_stream(true)}) {
    SCOPED_TRACE(kn.name);
    const Shape os = kn.out_shape();
    const Tensor lse = Tensor::zeros(kn.lse_shape);
    // bf16 out from f32 q, k, v.
    Kernel f32_inputs = kn;
    for (Tensor* t : {&f32_inputs.q, &f32_inputs.k, &f32_inputs.v}) *t = t->to(DType::f32);
    std::string msg =
        error_of([&] { f32_inputs.forward(Tensor::zeros(os, DType::bf16), lse, Tensor()); });
    EXPECT_MENTIONS(msg, "unsupported dtypes");
    EXPECT_MENTIONS(msg, "q f32");
    EXPECT_MENTIONS(msg, "out bf16");
    // bf16 grad_q with an f32 grad_k (bf16 q, k, v).
    const Tensor out = Tensor::zeros(os, DType::bf16), grad_out = bf16_input(os, 41);
    msg = error_of([&] {
      kn.backward(out, lse, Tensor(), grad_out, Tensor::zeros(kn.q.shape(), DType::bf16),
                  Tensor::zeros(kn.k.shape()), Tensor::zeros(kn.v.shape(), DType::bf16));
    });
    EXPECT_MENTIONS(msg, "unsupported gradient dtypes");
    EXPECT_MENTIONS(msg, "grad_q bf16, grad_k f32, grad_v bf16");
    // bf16 gradients from an f32 out.
    msg = error_of([&] {
      kn.backward(
          Tensor::zeros(os), lse, Tensor(), grad_out, Tensor::zeros(kn.q.shape(), DType::bf16),
          Tensor::zeros(kn.k.shape(), DType::bf16), Tensor::zeros(kn.v.shape(), DType::bf16));
    });
    EXPECT_MENTIONS(msg, "unsupported gradient dtypes");
    EXPECT_MENTIONS(msg, "out f32, grad_out bf16, grad_q bf16");
    // An f64 out from bf16 q, k, v.
    msg = error_of([&] { kn.forward(Tensor::zeros(os, DType::f64), lse, Tensor()); });
    EXPECT_MENTIONS(msg, "q bf16, k bf16, v bf16, out f64");
  }
}

}  // namespace
}  // namespace roformer
