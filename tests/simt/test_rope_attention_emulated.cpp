// Attention with RoPE inside (core/cuda/kernels/rope_attention.cu) through
// the SIMT emulator against the CPU kernels: the composed path (rotate, then
// the list's attention kernels, run from the emulated kernel table) for f32
// padded batches and token streams, and the tensor-core kernel rotating on
// the fly for bf16 at head dim 64. No GPU needed.
#include <gtest/gtest.h>

#include "core/ops/rope_table.h"
#include "tests/simt/emulated_test_support.h"

namespace roformer {
namespace {

using namespace testing::emulated;
namespace cpu = kernels::cpu;
namespace emu = kernels::simt_cuda;

// q, k, v [B, H, S, D] (padded, mask [B, S]) or [T, H, D] (stream,
// segments); table [2, S or T, D/2] f32. `inputs` rotated: the backward
// takes q and k rotated once (the forward the unrotated, RoPE inside).
AttentionOutputs run(bool emulated, bool interleaved, const Tensor& q, const Tensor& k,
                     const Tensor& v, const Tensor& extra, const Tensor& table,
                     const Tensor& grad_out, DType out_dtype, int64_t keep_words,
                     kernels::RopeInputs inputs = kernels::RopeInputs::unrotated) {
  kernels::AttentionParams params;
  params.scale = 0.25;
  params.dropout_p = 0.1;
  params.dropout = DropoutKey{7, 1, 2, 3};
  params.longest_segment = 40;
  Shape stat = q.shape(), bits = q.shape();
  stat.pop_back();
  bits.back() = keep_words;
  AttentionOutputs r{poisoned(q.shape(), out_dtype), poisoned(stat, DType::f32),
                     poisoned(bits, DType::i32),     poisoned(q.shape(), out_dtype),
                     poisoned(k.shape(), out_dtype), poisoned(v.shape(), out_dtype)};
  EmulatedStream s;
  const kernels::Stream stream = emulated ? s.get() : cpu_stream();
  auto* forward = emulated ? &emu::rope_attention_forward : &cpu::rope_attention_forward;
  auto* backward = emulated ? &emu::rope_attention_backward : &cpu::rope_attention_backward;
  auto kt = [](const Tensor& t) { return kernel_tensor(t); };
  forward(stream, params, kt(table), interleaved, kt(q), kt(k), kt(v), kt(extra), kt(r.out),
          kt(r.lse), kt(r.bits));
  const bool once = inputs == kernels::RopeInputs::rotated;
  const Tensor qa = once ? testing::rotated_once(q, table, interleaved) : q;
  const Tensor ka = once ? testing::rotated_once(k, table, interleaved) : k;
  backward(stream, params, kt(table), interleaved, inputs, kt(qa), kt(ka), kt(v), kt(extra),
           kt(r.out), kt(r.lse), kt(r.bits), kt(grad_out), kt(r.dq), kt(r.dk), kt(r.dv));
  return r;
}

Tensor table_for(int64_t S, int64_t D) {
  std::vector<int64_t> positions(static_cast<size_t>(S));
  for (int64_t i = 0; i < S; ++i) positions[size_t(i)] = (i * 5) % 61;
  return rope_table(Tensor::from_vector(positions, {S}), D, 10000.0, DType::f32);
}

TEST(RopeAttentionEmulated, PaddedComposedAndFusedMatchTheCpu) {
  const int64_t B = 2, H = 2, S = 40;
  std::vector<int32_t> m(static_cast<size_t>(B * S), 1);
  for (int64_t j = 30; j < S; ++j) m[size_t(S + j)] = 0;
  const Tensor mask = Tensor::from_vector(m, {B, S});
  for (int64_t D : {24, 64}) {
    for (bool interleaved : {false, true}) {
      SCOPED_TRACE("head dim " + std::to_string(D) + (interleaved ? " interleaved" : " halves"));
      const Tensor q = random({B, H, S, D}, 1, DType::bf16).to(DType::f32);
      const Tensor k = random({B, H, S, D}, 2, DType::bf16).to(DType::f32);
      const Tensor v = random({B, H, S, D}, 3, DType::bf16).to(DType::f32);
      const Tensor g = random({B, H, S, D}, 4, DType::bf16).to(DType::f32);
      const Tensor table = table_for(S, D);
      const AttentionOutputs ref = run(false, interleaved, q, k, v, mask, table, g, DType::f32, 2);
      if (D == 64) {  // bf16 operands: the tensor-core kernel rotates as it loads
        auto b = [](const Tensor& t) { return t.to(DType::bf16); };
        // It rounds the rotated q and k to bf16: lse within the flash test's bounds.
        expect_attention_match(
            run(true, interleaved, b(q), b(k), b(v), mask, table, b(g), DType::f32, 2), ref, 2e-2,
            5e-3);
        // A table off a 16-byte boundary (its angles cannot travel by 16-byte
        // cp.async) takes the composed kernels, with the same results.
        std::vector<float> padded{0.0f};
        for (float x : table.to_vector<float>()) padded.push_back(x);
        const Tensor shifted = Tensor::from_vector(padded, {int64_t(padded.size())})
                                   .narrow(0, 1, table.numel())
                                   .view(table.shape());
        ASSERT_NE(reinterpret_cast<uintptr_t>(shifted.data()) % 16, 0u);
        expect_attention_match(
            run(true, interleaved, b(q), b(k), b(v), mask, shifted, b(g), DType::f32, 2), ref, 2e-2,
            5e-3);
      } else {
        expect_attention_match(run(true, interleaved, q, k, v, mask, table, g, DType::f32, 2), ref,
                               1e-5, 1e-5);
      }
    }
  }
}

TEST(RopeAttentionEmulated, TokenStreamComposedMatchesTheCpu) {
  const int64_t T = 60, H = 2, D = 24;
  const Tensor segments =
      Tensor::from_vector(std::vector<int64_t>{0, 40, 0, 0, 40, 15, 1, 2}, {2, 4});
  const Tensor q = random({T, H, D}, 5, DType::f32), k = random({T, H, D}, 6, DType::f32);
  const Tensor v = random({T, H, D}, 7, DType::f32), g = random({T, H, D}, 8, DType::f32);
  const Tensor table = table_for(T, D);
  for (bool interleaved : {false, true}) {
    SCOPED_TRACE(interleaved ? "interleaved" : "halves");
    expect_attention_match(run(true, interleaved, q, k, v, segments, table, g, DType::f32, 2),
                           run(false, interleaved, q, k, v, segments, table, g, DType::f32, 2),
                           1e-5, 1e-5);
  }
}

// The backward given q and k rotated once (RopeInputs::rotated, the op's
// default on token streams) gives the gradients of the unrotated q and k:
// on the CPU and through the emulated composed path (f32, head dim 24) as
// the backward that rotates them itself, and through the emulated
// tensor-core kernel (bf16, head dim 64) within its tolerances of the CPU.
TEST(RopeAttentionEmulated, RotatedInputsGiveTheGradientsOfTheUnrotated) {
  const auto rotated_inputs = kernels::RopeInputs::rotated;
  const int64_t B = 2, H = 2, S = 40;
  std::vector<int32_t> m(static_cast<size_t>(B * S), 1);
  for (int64_t j = 30; j < S; ++j) m[size_t(S + j)] = 0;
  const Tensor mask = Tensor::from_vector(m, {B, S});
  // The stream: every token in a segment (the tensor-core kernel leaves the
  // others to the op's zero fill), the longest 40.
  const int64_t T = 60;
  const Tensor segments =
      Tensor::from_vector(std::vector<int64_t>{0, 40, 0, 0, 40, 20, 1, 2}, {2, 4});
  for (const bool stream : {false, true}) {
    for (const int64_t D : {24, 64}) {
      for (const bool interleaved : {false, true}) {
        SCOPED_TRACE(std::string(stream ? "stream" : "padded") + ", head dim " + std::to_string(D) +
                     (interleaved ? ", interleaved" : ", halves"));
        const Shape shape = stream ? Shape{T, H, D} : Shape{B, H, S, D};
        const Tensor q = random(shape, 11, DType::bf16).to(DType::f32);
        const Tensor k = random(shape, 12, DType::bf16).to(DType::f32);
        const Tensor v = random(shape, 13, DType::bf16).to(DType::f32);
        const Tensor g = random(shape, 14, DType::bf16).to(DType::f32);
        const Tensor extra = stream ? segments : mask;
        const Tensor table = table_for(stream ? T : S, D);
        const AttentionOutputs ref =
            run(false, interleaved, q, k, v, extra, table, g, DType::f32, 2);
        expect_attention_match(
            run(false, interleaved, q, k, v, extra, table, g, DType::f32, 2, rotated_inputs), ref,
            1e-5, 1e-5);
        if (D == 64) {
          auto b = [](const Tensor& t) { return t.to(DType::bf16); };
          expect_attention_match(run(true, interleaved, b(q), b(k), b(v), extra, table, b(g),
                                     DType::f32, 2, rotated_inputs),
                                 ref, 2e-2, 5e-3);
        } else {
          expect_attention_match(
              run(true, interleaved, q, k, v, extra, table, g, DType::f32, 2, rotated_inputs), ref,
              1e-5, 1e-5);
        }
      }
    }
  }
}

}  // namespace
}  // namespace roformer
