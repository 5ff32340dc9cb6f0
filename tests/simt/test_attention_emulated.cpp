// The attention kernels of the list (core/cuda/kernels/attention.cu: the
// simple f32/f64 kernels, the bf16 copies for other head dims, the dispatch
// to the tensor-core kernel; token_stream.cu: token dropout and the
// variable-length attention with its per-segment fallback) run through the
// SIMT emulator against the CPU kernels, forward then backward, each side on
// its own forward's outputs. Key tiles of 128: 150 keys cross one. No GPU
// needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <utility>

#include "tests/simt/emulated_test_support.h"
#include "tests/test_support.h"

namespace roformer {
namespace {

using namespace testing::emulated;
namespace cpu = kernels::cpu;
namespace emu = kernels::simt_cuda;

struct Inputs {
  Tensor q, k, v, grad_out, mask_or_segments;
};

kernels::AttentionParams params_with(double dropout_p) {
  kernels::AttentionParams params;
  params.scale = 0.2;
  params.dropout_p = dropout_p;
  params.dropout = DropoutKey{17, 3, 5, 2};
  return params;
}

// Padded attention: q [B, H, Sq, D] over [B, Sq, H, D] memory (strided heads).
Inputs padded_inputs(int64_t B, int64_t H, int64_t Sq, int64_t Sk, int64_t D, int64_t Dv, DType t,
                     bool all_masked_row) {
  Inputs in;
  in.q = random({B, Sq, H, D}, 1, t).transpose(1, 2);
  in.k = random({B, H, Sk, D}, 2, t);
  in.v = random({B, H, Sk, Dv}, 3, t);
  in.grad_out = random({B, H, Sq, Dv}, 4, t);
  std::vector<int32_t> m(size_t(B * Sk), 1);
  for (int64_t j = std::max<int64_t>(Sk - 30, 1); j < Sk; ++j) m[size_t(j)] = 0;  // padding
  for (int64_t j = 0; B > 1 && j < Sk; j += 3) m[size_t(Sk + j)] = 0;
  if (all_masked_row)
    for (int64_t j = 0; B > 1 && j < Sk; ++j) m[size_t(Sk + j)] = 0;
  in.mask_or_segments = Tensor::from_vector(m, {B, Sk});
  return in;
}

// The forward into the poisoned outputs `o`, then the backward on them
// (padded and token-stream kernels take the same arguments).
AttentionOutputs run(kernels::signature::attention_forward* forward,
                     kernels::signature::attention_backward* backward, bool emulated,
                     const kernels::AttentionParams& params, const Inputs& in, AttentionOutputs o) {
  EmulatedStream s;
  const kernels::Stream stream = emulated ? s.get() : cpu_stream();
  auto kt = [](const Tensor& t) { return kernel_tensor(t); };
  forward(stream, params, kt(in.q), kt(in.k), kt(in.v), kt(in.mask_or_segments), kt(o.out),
          kt(o.lse), kt(o.bits));
  backward(stream, params, kt(in.q), kt(in.k), kt(in.v), kt(in.mask_or_segments), kt(o.out),
           kt(o.lse), kt(o.bits), kt(in.grad_out), kt(o.dq), kt(o.dk), kt(o.dv));
  return o;
}

AttentionOutputs padded_on(bool emulated, const kernels::AttentionParams& params, const Inputs& in,
                           DType out_dtype) {
  const int64_t B = in.q.shape()[0], H = in.q.shape()[1], Sq = in.q.shape()[2];
  const int64_t Sk = in.k.shape()[2], Dv = in.v.shape()[3];
  const DType stat = in.q.dtype() == DType::f64 ? DType::f64 : DType::f32;
  AttentionOutputs o{
      poisoned({B, H, Sq, Dv}, out_dtype),
      poisoned({B, H, Sq}, stat),
      params.dropout_p > 0 ? poisoned({B, H, Sq, (Sk + 31) / 32}, DType::i32) : Tensor(),
      poisoned(in.q.shape(), out_dtype),
      poisoned(in.k.shape(), out_dtype),
      poisoned(in.v.shape(), out_dtype)};
  return run(emulated ? &emu::attention_forward : &cpu::attention_forward,
             emulated ? &emu::attention_backward : &cpu::attention_backward, emulated, params, in,
             std::move(o));
}

TEST(AttentionEmulated, SimpleKernelsMatchTheCpu) {
  for (DType t : {DType::f32, DType::f64}) {
    for (double p : {0.0, 0.1}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " dropout " + std::to_string(p));
      // Different head dims for q/k and v; a batch row with every key masked.
      const Inputs in = padded_inputs(2, 2, 20, 150, 24, 40, t, p > 0);
      const double tol = t == DType::f64 ? 1e-12 : 1e-5;
      expect_attention_match(padded_on(true, params_with(p), in, t),
                             padded_on(false, params_with(p), in, t), tol, tol);
    }
  }
}

// bf16 operands, f32 outputs: head dim 32 through f32 copies and the simple
// kernels, head dim 64 to the tensor-core kernel; against the CPU on the
// same (bf16-exact) values in f32.
TEST(AttentionEmulated, Bf16OperandsTakeTheCopiesOrTheTensorCores) {
  for (int64_t D : {32, 64}) {
    SCOPED_TRACE("head dim " + std::to_string(D));
    const Inputs in = padded_inputs(1, 2, 40, 150, D, D, DType::bf16, false);
    Inputs in32 = in;
    for (Tensor* x : {&in32.q, &in32.k, &in32.v, &in32.grad_out}) *x = x->to(DType::f32);
    const AttentionOutputs ref = padded_on(false, params_with(0.1), in32, DType::f32);
    const AttentionOutputs got = padded_on(true, params_with(0.1), in, DType::f32);
    // The tensor cores round the probabilities to bf16: the flash test's bounds.
    expect_attention_match(got, ref, D == 64 ? 2e-2 : 1e-5, D == 64 ? 1e-4 : 1e-5);
  }
}

TEST(AttentionEmulated, TheVendorEngineIsRefused) {
  const Inputs in = padded_inputs(1, 1, 4, 4, 64, 64, DType::bf16, false);
  kernels::AttentionParams params = params_with(0.0);
  params.engine = kernels::AttentionEngine::vendor;
  const std::string msg = testing::error_of([&] { padded_on(true, params, in, DType::f32); });
  EXPECT_NE(msg.find("cuDNN"), std::string::npos) << msg;
}

// --- token streams ---------------------------------------------------------------------
// Segments (first token, length, row, position): 70 (crossing a key tile), 1,
// 60, and 19 tokens in no segment (not written: they stay poisoned on both).
Inputs stream_inputs(int64_t H, int64_t D, DType t) {
  const int64_t T = 150;
  Inputs in;
  in.q = random({T, H, D}, 5, t);
  in.k = random({T, H, D}, 6, t);
  in.v = random({T, H, D}, 7, t);
  in.grad_out = random({T, H, D}, 8, t);
  in.mask_or_segments =
      Tensor::from_vector(std::vector<int64_t>{0, 70, 0, 0, 70, 1, 0, 70, 71, 60, 1, 3}, {3, 4});
  return in;
}

AttentionOutputs stream_on(bool emulated, const kernels::AttentionParams& params, const Inputs& in,
                           DType out_dtype) {
  const int64_t T = in.q.shape()[0], H = in.q.shape()[1];
  const DType stat = in.q.dtype() == DType::f64 ? DType::f64 : DType::f32;
  AttentionOutputs o{poisoned(in.v.shape(), out_dtype),
                     poisoned({T, H}, stat),
                     params.dropout_p > 0 ? poisoned({T, H, (70 + 31) / 32}, DType::i32) : Tensor(),
                     poisoned(in.q.shape(), out_dtype),
                     poisoned(in.k.shape(), out_dtype),
                     poisoned(in.v.shape(), out_dtype)};
  return run(emulated ? &emu::attention_varlen_forward : &cpu::attention_varlen_forward,
             emulated ? &emu::attention_varlen_backward : &cpu::attention_varlen_backward, emulated,
             params, in, std::move(o));
}

TEST(TokenStreamEmulated, VarlenAttentionMatchesTheCpu) {
  kernels::AttentionParams params = params_with(0.1);
  params.longest_segment = 70;
  for (DType t : {DType::f32, DType::f64}) {
    SCOPED_TRACE(dtype_name(t));
    const Inputs in = stream_inputs(2, 24, t);
    const double tol = t == DType::f64 ? 1e-12 : 1e-5;
    expect_attention_match(stream_on(true, params, in, t), stream_on(false, params, in, t), tol,
                           tol);
  }
  for (int64_t D : {32, 64}) {
    SCOPED_TRACE("bf16, head dim " + std::to_string(D));
    const Inputs in = stream_inputs(2, D, DType::bf16);
    Inputs in32 = in;
    for (Tensor* x : {&in32.q, &in32.k, &in32.v, &in32.grad_out}) *x = x->to(DType::f32);
    expect_attention_match(stream_on(true, params, in, DType::f32),
                           stream_on(false, params, in32, DType::f32), D == 64 ? 2e-2 : 1e-5,
                           D == 64 ? 1e-4 : 1e-5);
  }
}

TEST(TokenStreamEmulated, DropoutTokensKeepsTheCpusElements) {
  const int64_t T = 90, F = 43;  // a thread per group of 8 features: 43 leaves a tail of 3
  std::vector<int64_t> tokens;
  for (int64_t i = 0; i < T; ++i) {
    tokens.push_back(i < 50 ? 0 : 2);       // row
    tokens.push_back(i < 50 ? i : i - 50);  // position in it
  }
  const Tensor tok = Tensor::from_vector(tokens, {T, 2});
  const DropoutKey key{17, 3, 5, 2};
  for (DType t : {DType::f32, DType::bf16, DType::f64}) {
    SCOPED_TRACE(dtype_name(t));
    const Tensor x = random({T, F}, 9, t, 1.0, 3.0);
    const Tensor ref = poisoned({T, F}, t), got = poisoned({T, F}, t);
    cpu::dropout_tokens(cpu_stream(), kernel_tensor(x), kernel_tensor(ref), kernel_tensor(tok),
                        0.25, key);
    EmulatedStream s;
    emu::dropout_tokens(s.get(), kernel_tensor(x), kernel_tensor(got), kernel_tensor(tok), 0.25,
                        key);
    expect_equal(got, ref, "dropout_tokens");
  }
}

}  // namespace
}  // namespace roformer
