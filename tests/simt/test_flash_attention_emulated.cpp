// The bf16 tensor-core attention kernel's own source
// (core/cuda/kernels/flash_attention.cu) run through the SIMT emulator:
// the forward and both backward schemes (fused, with one and more splits;
// two passes) against the CPU kernels on the cases of
// tests/cuda/test_flash_attention.cpp, made small (S = 130: a full and a
// partial tile; 2 heads), at the same tolerances; and the edges: no query
// rows, no keys, a short RoPE table, bf16 outputs, query and key lengths
// that differ. No GPU needed.
#include <gtest/gtest.h>

#include "tests/cuda/flash_attention_cases.h"
#include "tests/simt/flash_attention_emulated.h"
#include "tests/test_support.h"

namespace roformer {
namespace {

using namespace testing::flash;
using kernels::kernel_tensor;
using kernels::KernelTensor;
using testing::bf16_values;
using testing::host;
using testing::rotated_once;

// The emulated kernels on CPU tensors: bf16 operands, f32 outputs.
Result run_emulated(const Case& c, const Problem& p) {
  const kernels::AttentionParams params = params_of(c, p);
  const Device cpu = Device::cpu();
  auto bf16 = [](const Tensor& t) { return t.to(DType::bf16).contiguous(); };
  const Tensor q = bf16(p.q), k = bf16(p.k), v = bf16(p.v), grad_out = bf16(p.grad_out);
  const Tensor table = rope_table_of(c, p, cpu, DType::f32);
  const KernelTensor table_k = kernel_tensor(table);
  const bool interleaved = c.layout == RopeLayout::interleaved;
  // Rotated once (Case::rotated_inputs): the forward takes the copies with
  // no table, the backward the copies and the table to rotate dq, dk back.
  const bool once = c.rope && c.rotated_inputs;
  const Tensor qa = once ? rotated_once(q, table, interleaved) : q;
  const Tensor ka = once ? rotated_once(k, table, interleaved) : k;
  const kernels::cuda::FlashRope forward_rope{c.rope && !once ? &table_k : nullptr, interleaved};
  const kernels::cuda::FlashRope backward_rope{c.rope ? &table_k : nullptr, interleaved, once};
  const KernelTensor extra = kernel_tensor(p.mask_or_segments);
  const KernelTensor mask = c.token_stream ? KernelTensor{} : extra;
  const KernelTensor segments = c.token_stream ? extra : KernelTensor{};
  Result r = poisoned_result(c, p, cpu, DType::f32);
  const kernels::Stream stream;
  EXPECT_TRUE(kernels::cuda::simt_flash_supported(kernel_tensor(qa), kernel_tensor(ka),
                                                  kernel_tensor(v), kernel_tensor(grad_out)));
  kernels::cuda::simt_flash_forward(
      stream, params, forward_rope, kernel_tensor(qa), kernel_tensor(ka), kernel_tensor(v), mask,
      segments, kernel_tensor(r.out), kernel_tensor(r.lse), kernel_tensor(r.bits));
  kernels::cuda::simt_flash_backward(
      stream, params, backward_rope, kernel_tensor(qa), kernel_tensor(ka), kernel_tensor(v), mask,
      segments, kernel_tensor(r.out), kernel_tensor(r.lse), kernel_tensor(r.bits),
      kernel_tensor(grad_out), kernel_tensor(r.dq), kernel_tensor(r.dk), kernel_tensor(r.dv));
  return r;
}

class FlashAttentionEmulated : public ::testing::TestWithParam<Case> {};

const FlashKnobs kKnobs{&kernels::cuda::simt_flash_forward_rows_per_warp,
                        &kernels::cuda::set_simt_flash_forward_rows_per_warp,
                        &kernels::cuda::simt_flash_dq_blocks_per_sm,
                        &kernels::cuda::set_simt_flash_dq_blocks_per_sm,
                        &kernels::cuda::simt_flash_backward_passes,
                        &kernels::cuda::set_simt_flash_backward_passes,
                        &kernels::cuda::simt_flash_backward_splits,
                        &kernels::cuda::set_simt_flash_backward_splits,
                        &kernels::cuda::simt_flash_forward_uses_wgmma,
                        &kernels::cuda::set_simt_flash_forward_uses_wgmma,
                        &kernels::cuda::simt_flash_backward_uses_wgmma,
                        &kernels::cuda::set_simt_flash_backward_uses_wgmma,
                        &kernels::cuda::simt_flash_wgmma_available,
                        &kernels::cuda::simt_flash_forward_schedule,
                        &kernels::cuda::set_simt_flash_forward_schedule,
                        &kernels::cuda::simt_flash_keep_bits_ahead,
                        &kernels::cuda::set_simt_flash_keep_bits_ahead,
                        &kernels::cuda::simt_flash_backward_alternates_sweeps,
                        &kernels::cuda::set_simt_flash_backward_alternates_sweeps};

// Every variant (forward tilings, backward schemes, dq blocks an SM, fused
// splits: flash_variants) against the CPU, and against the defaults.
TEST_P(FlashAttentionEmulated, MatchesTheCpuForwardAndBackward) {
  const Case& c = GetParam();
  const Problem p = make_problem(c);
  expect_variants_match(kKnobs, c, p, run(c, p, Device::cpu(), DType::f32),
                        [&] { return run_emulated(c, p); });
}

TEST(FlashAttentionEmulatedEdges, TheVariantsAreTheOnesListed) {
  EXPECT_EQ(kernels::cuda::simt_flash_forward_rows_per_warp(), 16);
  EXPECT_THROW(kernels::cuda::set_simt_flash_forward_rows_per_warp(8), Error);
  EXPECT_EQ(kernels::cuda::simt_flash_forward_rows_per_warp(), 16);
  EXPECT_EQ(kernels::cuda::simt_flash_dq_blocks_per_sm(), 2);
  EXPECT_THROW(kernels::cuda::set_simt_flash_dq_blocks_per_sm(3), Error);
  EXPECT_EQ(kernels::cuda::simt_flash_dq_blocks_per_sm(), 2);
  EXPECT_EQ(kernels::cuda::simt_flash_backward_passes(), 1);
  EXPECT_THROW(kernels::cuda::set_simt_flash_backward_passes(3), Error);
  EXPECT_EQ(kernels::cuda::simt_flash_backward_passes(), 1);
  EXPECT_EQ(kernels::cuda::simt_flash_backward_splits(), 0);
  EXPECT_THROW(kernels::cuda::set_simt_flash_backward_splits(-1), Error);
  EXPECT_THROW(kernels::cuda::set_simt_flash_backward_splits(65), Error);
  EXPECT_EQ(kernels::cuda::simt_flash_backward_splits(), 0);
  // The wgmma kernels are the default (on compute capability 9.0 alone)
  // since an H100 timed them faster (docs/performance/attention.md).
  EXPECT_TRUE(kernels::cuda::simt_flash_forward_uses_wgmma());
  EXPECT_TRUE(kernels::cuda::simt_flash_backward_uses_wgmma());
  // The forward's schedule is chosen per kernel (flash_attention.h).
  EXPECT_EQ(kernels::cuda::simt_flash_forward_schedule(), ForwardSchedule::automatic);
  // The keep bits are drawn ahead since an H200 timed it faster
  // (docs/performance/attention.md); the backward's sweeps run upwards.
  EXPECT_TRUE(kernels::cuda::simt_flash_keep_bits_ahead());
  EXPECT_FALSE(kernels::cuda::simt_flash_backward_alternates_sweeps());
}

// The tensor-core cases of the GPU test, shrunk to what the emulator runs in
// seconds; the token streams keep their segments (70 and 1, 130, 45, 19, 64).
// plain_growing_scores keeps the GPU's S = 200: its flaw (session 20) showed
// there and passed at 130.
std::vector<Case> emulated_cases() {
  std::vector<Case> out;
  for (Case c : cases()) {
    if (c.D != 64 || c.S > 300) continue;
    if (!c.growing_scores) {
      c.S = 130;
      c.H = 2;
    }
    out.push_back(c);
  }
  return out;
}

// Alternating sweeps keep dq's bits: the model's case (a token stream with
// dropout, q and k rotated once; its 130-token segment has two key tiles)
// and a padded batch (its keys unmasked: masked keys have no gradient to
// sum), at one split.
TEST(FlashAttentionEmulatedEdges, AlternatingSweepsKeepDqsBits) {
  for (const Case& c : emulated_cases()) {
    if (c.name != "packed_dropout_rotated_once_interleaved" && c.name != "padded_half") continue;
    SCOPED_TRACE(c.name);
    const Problem p = make_problem(c);
    expect_alternating_sweeps_keep_dq(kKnobs, {1}, [&] { return run_emulated(c, p); });
  }
}

// No query rows (Sq = 0) but keys: the key-tile kernel alone runs and writes
// the zero key and value gradients (they start as NaN), on mma.sync and on
// wgmma.
TEST(FlashAttentionEmulatedEdges, NoQueryRowsGiveZeroKeyGradients) {
  for (const FlashSettings& settings : {mma_sync_variant(), wgmma_variant()}) {
    SCOPED_TRACE(settings.what);
    const ScopedFlashSettings scoped(kKnobs, settings);
    const int64_t H = 3, Sk = 70;
    const Device cpu = Device::cpu();
    const Tensor q = Tensor::zeros({2, H, 0, 64}, DType::bf16, cpu);
    const Tensor k = bf16_values({2, H, Sk, 64}, 2).to(DType::bf16);
    const Tensor v = bf16_values({2, H, Sk, 64}, 3).to(DType::bf16);
    auto nan = [&](const Shape& shape) { return Tensor::full(shape, NAN, DType::f32, cpu); };
    const Tensor out = nan({2, H, 0, 64}), lse = nan({2, H, 0}), dq = nan({2, H, 0, 64});
    const Tensor dk = nan({2, H, Sk, 64}), dv = nan({2, H, Sk, 64});
    kernels::AttentionParams params;
    params.scale = 0.125;
    kernels::cuda::simt_flash_backward(
        kernels::Stream{}, params, kernels::cuda::FlashRope{}, kernel_tensor(q), kernel_tensor(k),
        kernel_tensor(v), KernelTensor{}, KernelTensor{}, kernel_tensor(out), kernel_tensor(lse),
        KernelTensor{}, kernel_tensor(q), kernel_tensor(dq), kernel_tensor(dk), kernel_tensor(dv));
    for (const Tensor* g : {&dk, &dv})
      for (double x : host(*g)) ASSERT_EQ(x, 0.0);
  }
}

// A caller that understates params.longest_segment (here 100 for a segment
// of 130 tokens: one key tile a sequence by the grid, two in the segment)
// breaks the kernel list's contract; the fused backward then has no scratch
// for its running dq sums and must not write into it (the kernels' unit is
// built with AddressSanitizer, which reports a write past the 1-byte
// stand-in). The gradients are wrong (rows past the grid's tile even get no
// D), as the forward's output would be. On mma.sync and on wgmma.
TEST(FlashAttentionEmulatedEdges, AnUnderstatedLongestSegmentWritesNothingOutOfBounds) {
  for (const FlashSettings& settings : {mma_sync_variant(), wgmma_variant()}) {
    SCOPED_TRACE(settings.what);
    const int64_t T = 130, H = 2;
    const Device cpu = Device::cpu();
    const Tensor x = bf16_values({T, H, 64}, 1).to(DType::bf16);
    const Tensor segments = Tensor::from_vector(std::vector<int64_t>{0, T, 0, 0}, {1, 4});
    const Tensor out = Tensor::zeros({T, H, 64}, DType::f32, cpu);
    const Tensor lse = Tensor::zeros({T, H}, DType::f32, cpu);
    const Tensor dq = Tensor::full({T, H, 64}, NAN, DType::f32, cpu);
    const Tensor dk = Tensor::full({T, H, 64}, NAN, DType::f32, cpu);
    const Tensor dv = Tensor::full({T, H, 64}, NAN, DType::f32, cpu);
    kernels::AttentionParams params;
    params.scale = 0.125;
    params.longest_segment = 100;
    const ScopedFlashSettings fused(kKnobs, settings);
    kernels::cuda::simt_flash_backward(kernels::Stream{}, params, kernels::cuda::FlashRope{},
                                       kernel_tensor(x), kernel_tensor(x), kernel_tensor(x),
                                       KernelTensor{}, kernel_tensor(segments), kernel_tensor(out),
                                       kernel_tensor(lse), KernelTensor{}, kernel_tensor(x),
                                       kernel_tensor(dq), kernel_tensor(dk), kernel_tensor(dv));
    // dq's rows the grid covers were written (in the last key tile's pass).
    const std::vector<double> got = host(dq);
    for (size_t e = 0; e < size_t(100 * H * 64); ++e) ASSERT_FALSE(std::isnan(got[e])) << e;
  }
}

// Given q and k rotated once (FlashRope::inputs_rotated, the op's default on
// token streams), the backward rotates dq and dk back as it writes them, so
// each is rounded to bf16 once: its bf16 gradients are its f32 ones rounded,
// bit for bit, under each backward scheme (one split: the last key tile
// writes dq; three: the adding kernel rotates it; two passes; wgmma). The op
// before (a bf16 gradient of the rotated copy, then the rope kernel) rounded
// twice. And its f32 gradients are those of the kernel rotating the
// unrotated q and k as they load, to f32 rounding (a rotation left out or
// done twice fails that). A forward told its inputs are rotated is refused.
TEST(FlashAttentionEmulatedEdges, GradientsOfRotatedInputsAreRoundedOnce) {
  const int64_t T = 300, H = 1;  // one segment of three key tiles
  const Device cpu = Device::cpu();
  const Tensor segments = Tensor::from_vector(std::vector<int64_t>{0, T, 0, 0}, {1, 4});
  std::vector<int64_t> positions(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) positions[size_t(i)] = i;
  const Tensor table = rope_table(Tensor::from_vector(positions, {T}), 64, 10000.0, DType::f32);
  const KernelTensor table_k = kernel_tensor(table);
  auto bf16 = [](const Tensor& t) { return t.to(DType::bf16).contiguous(); };
  const Tensor q0 = bf16(bf16_values({T, H, 64}, 1)), k0 = bf16(bf16_values({T, H, 64}, 2));
  const Tensor q = rotated_once(q0, table, false);
  const Tensor k = rotated_once(k0, table, false);
  const Tensor v = bf16(bf16_values({T, H, 64}, 3)), g = bf16(bf16_values({T, H, 64}, 4));
  kernels::AttentionParams params;
  params.scale = 0.125;
  params.dropout_p = 0.1;
  params.dropout = DropoutKey{17, 3, 5, 2};
  params.longest_segment = T;
  const Tensor out = Tensor::empty({T, H, 64}, DType::f32, cpu);
  const Tensor lse = Tensor::empty({T, H}, DType::f32, cpu);
  const Tensor bits = Tensor::empty({T, H, (T + 31) / 32}, DType::i32, cpu);
  kernels::cuda::simt_flash_forward(kernels::Stream{}, params, kernels::cuda::FlashRope{},
                                    kernel_tensor(q), kernel_tensor(k), kernel_tensor(v),
                                    KernelTensor{}, kernel_tensor(segments), kernel_tensor(out),
                                    kernel_tensor(lse), kernel_tensor(bits));
  const kernels::cuda::FlashRope rotated{&table_k, false, true}, inside{&table_k, false};
  auto gradients = [&](DType dtype, bool once) {
    std::vector<Tensor> grads;
    for (int n = 0; n < 3; ++n) grads.push_back(Tensor::full({T, H, 64}, NAN, dtype, cpu));
    kernels::cuda::simt_flash_backward(
        kernels::Stream{}, params, once ? rotated : inside, kernel_tensor(once ? q : q0),
        kernel_tensor(once ? k : k0), kernel_tensor(v), KernelTensor{}, kernel_tensor(segments),
        kernel_tensor(out), kernel_tensor(lse), kernel_tensor(bits), kernel_tensor(g),
        kernel_tensor(grads[0]), kernel_tensor(grads[1]), kernel_tensor(grads[2]));
    return grads;
  };
  const FlashSettings schemes[] = {{16, 2, 1, 1, "fused backward, one split"},
                                   {16, 2, 1, 3, "fused backward, three splits"},
                                   {16, 2, 2, 0, "two-pass backward"},
                                   {16, 2, 1, 1, "wgmma fused backward, one split", true, true},
                                   {16, 2, 1, 3, "wgmma fused backward, three splits", true, true}};
  for (const FlashSettings& settings : schemes) {
    SCOPED_TRACE(settings.what);
    const ScopedFlashSettings scoped(kKnobs, settings);
    const std::vector<Tensor> wide = gradients(DType::f32, true),
                              narrow = gradients(DType::bf16, true),
                              loaded = gradients(DType::f32, false);
    for (size_t n = 0; n < 3; ++n) {
      SCOPED_TRACE("gradient " + std::to_string(n));
      const std::vector<float> once = wide[n].to(DType::bf16).to_vector<float>();
      const std::vector<float> got = narrow[n].to_vector<float>();
      ASSERT_EQ(got.size(), once.size());
      size_t differ = 0;
      for (size_t e = 0; e < got.size(); ++e) differ += got[e] != once[e];
      EXPECT_EQ(differ, 0u);
      const std::vector<float> a = wide[n].to_vector<float>(), b = loaded[n].to_vector<float>();
      double err = 0, scale = 0;
      for (size_t e = 0; e < a.size(); ++e) {
        err = std::max(err, double(std::abs(a[e] - b[e])));
        scale = std::max(scale, double(std::abs(b[e])));
      }
      EXPECT_GT(scale, 0.0);
      EXPECT_LT(err, 1e-4 * scale) << "the rotated-once gradient against RoPE inside";
    }
  }
  const Tensor unused = Tensor::empty({T, H, 64}, DType::f32, cpu);
  const std::string msg = testing::error_of([&] {
    kernels::cuda::simt_flash_forward(kernels::Stream{}, params, rotated, kernel_tensor(q),
                                      kernel_tensor(k), kernel_tensor(v), KernelTensor{},
                                      kernel_tensor(segments), kernel_tensor(unused),
                                      kernel_tensor(lse), kernel_tensor(bits));
  });
  EXPECT_NE(msg.find("the forward takes rotated q and k without a RoPE table"), std::string::npos)
      << msg;
}

// A RoPE table with fewer rows than q's sequence is refused before any launch.
TEST(FlashAttentionEmulatedEdges, ATableShorterThanTheSequenceIsAnError) {
  const int64_t S = 40;
  const Tensor x = bf16_values({1, 2, S, 64}, 5).to(DType::bf16);
  const Tensor positions = Tensor::from_vector(std::vector<int64_t>(size_t(S - 1), 0), {S - 1});
  const Tensor table = rope_table(positions, 64, 10000.0, DType::f32);
  const KernelTensor table_k = kernel_tensor(table);
  const Tensor out = Tensor::empty({1, 2, S, 64}, DType::f32, Device::cpu());
  const Tensor lse = Tensor::empty({1, 2, S}, DType::f32, Device::cpu());
  const std::string msg = testing::error_of([&] {
    kernels::cuda::simt_flash_forward(
        kernels::Stream{}, kernels::AttentionParams{}, kernels::cuda::FlashRope{&table_k, true},
        kernel_tensor(x), kernel_tensor(x), kernel_tensor(x), KernelTensor{}, KernelTensor{},
        kernel_tensor(out), kernel_tensor(lse), KernelTensor{});
  });
  EXPECT_NE(msg.find("RoPE table"), std::string::npos) << msg;
}

// The kernels address rows by 32-bit row strides (RowStream): a stride of
// 2 GiB or more is refused before any launch, naming the operand.
TEST(FlashAttentionEmulatedEdges, ARowStrideOf2GiBIsAnError) {
  const int64_t S = 40;
  const Tensor x = bf16_values({1, 2, S, 64}, 5).to(DType::bf16);
  KernelTensor wide = kernel_tensor(x);
  wide.strides[2] = int64_t(1) << 30;  // 2 GiB of bf16 between rows; never read
  const Tensor out = Tensor::empty({1, 2, S, 64}, DType::f32, Device::cpu());
  const Tensor lse = Tensor::empty({1, 2, S}, DType::f32, Device::cpu());
  const std::string msg = testing::error_of([&] {
    kernels::cuda::simt_flash_forward(kernels::Stream{}, kernels::AttentionParams{},
                                      kernels::cuda::FlashRope{}, kernel_tensor(x), wide,
                                      kernel_tensor(x), KernelTensor{}, KernelTensor{},
                                      kernel_tensor(out), kernel_tensor(lse), KernelTensor{});
  });
  EXPECT_NE(msg.find("flash attention: k has 40 rows of stride 2147483648 bytes"),
            std::string::npos)
      << msg;
}

// bf16 outputs (out and the gradients) and padded batches with more keys
// than queries or fewer: the kernel's other store and read paths, and query
// and key tile counts that differ, against the CPU in f32, under every
// variant.
void expect_bf16_outputs_match(int64_t Sq, int64_t Sk) {
  SCOPED_TRACE("Sq " + std::to_string(Sq) + ", Sk " + std::to_string(Sk));
  const int64_t B = 2, H = 2;
  const Device cpu = Device::cpu();
  const Tensor q = bf16_values({B, H, Sq, 64}, 1), k = bf16_values({B, H, Sk, 64}, 2);
  const Tensor v = bf16_values({B, H, Sk, 64}, 3), grad_out = bf16_values({B, H, Sq, 64}, 4);
  std::vector<int32_t> m(size_t(B * Sk), 1);
  for (int64_t j = Sk - 30; j < Sk; ++j) m[size_t(j)] = 0;  // row 0: padding at the end
  const Tensor mask = Tensor::from_vector(m, {B, Sk});
  kernels::AttentionParams params;
  params.scale = 0.125;
  params.dropout_p = 0.1;
  params.dropout = DropoutKey{17, 3, 5, 2};
  auto run_on = [&](DType out_dtype, bool emulated) {
    auto nan = [&](const Shape& shape, DType d) { return Tensor::full(shape, NAN, d, cpu); };
    Result r;
    r.out = nan({B, H, Sq, 64}, out_dtype);
    r.lse = nan({B, H, Sq}, DType::f32);
    r.bits = Tensor::full({B, H, Sq, (Sk + 31) / 32}, -1.0, DType::i32, cpu);
    r.dq = nan({B, H, Sq, 64}, out_dtype);
    r.dk = nan({B, H, Sk, 64}, out_dtype);
    r.dv = nan({B, H, Sk, 64}, out_dtype);
    if (!emulated) {
      launch::attention_forward(cpu, params, q, k, v, mask, r.out, r.lse, r.bits);
      launch::attention_backward(cpu, params, q, k, v, mask, r.out, r.lse, r.bits, grad_out, r.dq,
                                 r.dk, r.dv);
      return r;
    }
    auto kt = [](const Tensor& t) { return kernel_tensor(t); };
    const Tensor qb = q.to(DType::bf16), kb = k.to(DType::bf16), vb = v.to(DType::bf16),
                 gb = grad_out.to(DType::bf16);
    const kernels::cuda::FlashRope none{};
    kernels::cuda::simt_flash_forward(kernels::Stream{}, params, none, kt(qb), kt(kb), kt(vb),
                                      kt(mask), KernelTensor{}, kt(r.out), kt(r.lse), kt(r.bits));
    kernels::cuda::simt_flash_backward(kernels::Stream{}, params, none, kt(qb), kt(kb), kt(vb),
                                       kt(mask), KernelTensor{}, kt(r.out), kt(r.lse), kt(r.bits),
                                       kt(gb), kt(r.dq), kt(r.dk), kt(r.dv));
    return r;
  };
  const Result ref = run_on(DType::f32, false), got = run_on(DType::bf16, true);
  auto err = [](const Tensor& a, const Tensor& b) {
    return testing::relative_error(host(a), host(b));
  };
  EXPECT_LT(err(got.out, ref.out), 2e-2);
  EXPECT_LT(err(got.dq, ref.dq), 4e-2);
  EXPECT_LT(err(got.dk, ref.dk), 4e-2);
  EXPECT_LT(err(got.dv, ref.dv), 4e-2);
  EXPECT_LT(err(got.lse, ref.lse), 1e-4);
  const auto bits = got.bits.to_vector<int32_t>(), ref_bits = ref.bits.to_vector<int32_t>();
  EXPECT_EQ(bits, ref_bits);
}

TEST(FlashAttentionEmulatedEdges, Bf16OutputsAndUnequalLengths) {
  for (const FlashSettings& settings : flash_variants()) {
    SCOPED_TRACE(settings.what);
    const ScopedFlashSettings scoped(kKnobs, settings);
    expect_bf16_outputs_match(70, 130);
    expect_bf16_outputs_match(130, 70);
    // One query tile, three key tiles: the fused kernels' early K and V
    // copies of the next key tile (covered by the mma.sync kernel's next
    // key tile's first wait, by the wgmma kernel's wait at the end of the
    // query tile that queued them).
    expect_bf16_outputs_match(40, 300);
  }
}

// Queries but no keys (Sk = 0): no key tile, so the fused scheme's dq comes
// from its finalize kernel alone, and both schemes write zeros (dq starts as
// NaN).
TEST(FlashAttentionEmulatedEdges, NoKeysGiveZeroQueryGradients) {
  const int64_t Sq = 70;
  const Device cpu = Device::cpu();
  const Tensor q = bf16_values({2, 2, Sq, 64}, 1).to(DType::bf16);
  const Tensor grad_out = bf16_values({2, 2, Sq, 64}, 4).to(DType::bf16);
  const Tensor k = Tensor::zeros({2, 2, 0, 64}, DType::bf16, cpu);
  const Tensor out = Tensor::zeros({2, 2, Sq, 64}, DType::f32, cpu);
  const Tensor lse = Tensor::full({2, 2, Sq}, -INFINITY, DType::f32, cpu);
  const Tensor empty = Tensor::zeros({2, 2, 0, 64}, DType::f32, cpu);
  kernels::AttentionParams params;
  params.scale = 0.125;
  for (const FlashSettings& settings : flash_variants()) {
    SCOPED_TRACE(settings.what);
    const ScopedFlashSettings scoped(kKnobs, settings);
    const Tensor dq = Tensor::full({2, 2, Sq, 64}, NAN, DType::f32, cpu);
    kernels::cuda::simt_flash_backward(
        kernels::Stream{}, params, kernels::cuda::FlashRope{}, kernel_tensor(q), kernel_tensor(k),
        kernel_tensor(k), KernelTensor{}, KernelTensor{}, kernel_tensor(out), kernel_tensor(lse),
        KernelTensor{}, kernel_tensor(grad_out), kernel_tensor(dq), kernel_tensor(empty),
        kernel_tensor(empty));
    for (double x : host(dq)) ASSERT_EQ(x, 0.0);
  }
}

// Keep bits drawn ahead for rows of more words than the kernel's block has
// threads (8,300 keys: 260 words a row, so a thread's next item is a word
// further along the same row), bit for bit the CPU's; the outputs as close.
TEST(FlashAttentionEmulatedEdges, KeepBitsDrawnAheadCoverRowsOfManyWords) {
  const int64_t Sq = 20, Sk = 8300, W = (Sk + 31) / 32;
  const Device cpu = Device::cpu();
  const Tensor q = bf16_values({1, 2, Sq, 64}, 1), k = bf16_values({1, 2, Sk, 64}, 2);
  const Tensor v = bf16_values({1, 2, Sk, 64}, 3);
  kernels::AttentionParams params;
  params.scale = 0.125;
  params.dropout_p = 0.1;
  params.dropout = DropoutKey{17, 3, 5, 2};
  const Tensor out = Tensor::zeros({1, 2, Sq, 64}, DType::f32, cpu);
  const Tensor lse = Tensor::zeros({1, 2, Sq}, DType::f32, cpu);
  const Tensor bits = Tensor::zeros({1, 2, Sq, W}, DType::i32, cpu);
  launch::attention_forward(cpu, params, q, k, v, Tensor{}, out, lse, bits);
  const ScopedFlashSettings scoped(
      kKnobs, {16, 2, 1, 0, "bits ahead", true, true, ForwardSchedule::pipelined, true});
  const Tensor got_out = Tensor::full({1, 2, Sq, 64}, NAN, DType::f32, cpu);
  const Tensor got_lse = Tensor::full({1, 2, Sq}, NAN, DType::f32, cpu);
  const Tensor got_bits = Tensor::full({1, 2, Sq, W}, -1.0, DType::i32, cpu);
  auto kt = [](const Tensor& t) { return kernel_tensor(t); };
  kernels::cuda::simt_flash_forward(kernels::Stream{}, params, kernels::cuda::FlashRope{},
                                    kt(q.to(DType::bf16)), kt(k.to(DType::bf16)),
                                    kt(v.to(DType::bf16)), KernelTensor{}, KernelTensor{},
                                    kt(got_out), kt(got_lse), kt(got_bits));
  EXPECT_EQ(got_bits.to_vector<int32_t>(), bits.to_vector<int32_t>());
  EXPECT_LT(testing::relative_error(host(got_out), host(out)), 2e-2);
}

// The forward with dropout but no keys, under every variant (the keep bits
// drawn ahead among them: no word to draw): rows of zeros, lse -inf.
TEST(FlashAttentionEmulatedEdges, NoKeysWithDropoutGiveEmptyRows) {
  const int64_t Sq = 70;
  const Device cpu = Device::cpu();
  const Tensor q = bf16_values({2, 2, Sq, 64}, 1).to(DType::bf16);
  const Tensor k = Tensor::zeros({2, 2, 0, 64}, DType::bf16, cpu);
  const Tensor bits = Tensor::zeros({2, 2, Sq, 0}, DType::i32, cpu);
  kernels::AttentionParams params;
  params.scale = 0.125;
  params.dropout_p = 0.1;
  params.dropout = DropoutKey{17, 3, 5, 2};
  for (const FlashSettings& settings : flash_variants()) {
    SCOPED_TRACE(settings.what);
    const ScopedFlashSettings scoped(kKnobs, settings);
    const Tensor out = Tensor::full({2, 2, Sq, 64}, NAN, DType::f32, cpu);
    const Tensor lse = Tensor::full({2, 2, Sq}, NAN, DType::f32, cpu);
    kernels::cuda::simt_flash_forward(kernels::Stream{}, params, kernels::cuda::FlashRope{},
                                      kernel_tensor(q), kernel_tensor(k), kernel_tensor(k),
                                      KernelTensor{}, KernelTensor{}, kernel_tensor(out),
                                      kernel_tensor(lse), kernel_tensor(bits));
    for (double x : host(out)) ASSERT_EQ(x, 0.0);
    for (double x : host(lse)) ASSERT_TRUE(std::isinf(x) && x < 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, FlashAttentionEmulated, ::testing::ValuesIn(emulated_cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace roformer
