// The cases of the bf16 tensor-core attention's tests and their CPU
// reference (tests/cuda/test_flash_attention.cpp on a GPU, and
// tests/simt/test_flash_attention_emulated.cpp through the SIMT emulator):
// operands rounded to bf16, padded batches with a key mask (one row fully
// masked), token streams, dropout, RoPE in both pair layouts; the comparison
// with the CPU kernels at the tolerances of the tensor-core path.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "core/ops.h"
#include "core/ops/dispatch.h"
#include "core/ops/rope_table.h"
#include "tests/cuda/gpu_test.h"

namespace roformer::testing::flash {

struct Case {
  std::string name;
  bool token_stream = false;
  int64_t B = 2, S = 200;                  // padded
  std::vector<std::vector<int64_t>> rows;  // token stream: document lengths per row
  bool mask = false;
  double dropout = 0.0;
  bool rope = true;
  RopeLayout layout = RopeLayout::interleaved;
  int64_t D = 64;  // 64: the tensor-core kernel; others: the f32 fallback on bf16 values
  int64_t H = 3;   // heads
};

// gtest prints a parameter in test listings; the name says it all (without
// this, ctest's test names carry a byte dump of the struct).
inline void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

// The geometry of a case: operands, mask or segments, positions.
struct Problem {
  Tensor q, k, v, grad_out;  // f32 holding bf16 values, CPU
  Tensor mask_or_segments;   // CPU
  Tensor positions;          // CPU, [S] or [T]
  int64_t longest = 0, tokens = 0;
  std::vector<std::vector<int64_t>> segments;  // token stream: (start, length, row, position)
};

inline Problem make_problem(const Case& c) {
  Problem p;
  std::vector<int64_t> positions;
  Shape shape;
  if (c.token_stream) {
    std::vector<int64_t> seg;
    for (size_t r = 0; r < c.rows.size(); ++r) {
      int64_t row_position = 0;
      for (int64_t len : c.rows[r]) {
        seg.insert(seg.end(), {p.tokens, len, int64_t(r), row_position});
        p.segments.push_back({p.tokens, len, int64_t(r), row_position});
        for (int64_t i = 0; i < len; ++i) positions.push_back(i);  // restart per document
        p.tokens += len;
        row_position += len;
        p.longest = std::max(p.longest, len);
      }
    }
    positions.push_back(0);  // one trailing token in no segment
    ++p.tokens;
    p.mask_or_segments = Tensor::from_vector(seg, {int64_t(seg.size() / 4), 4});
    shape = {p.tokens, c.H, c.D};
  } else {
    for (int64_t i = 0; i < c.S; ++i) positions.push_back(i + 3);
    shape = {c.B, c.H, c.S, c.D};
    p.longest = c.S;
    if (c.mask) {
      std::vector<int32_t> m(size_t(c.B * c.S), 1);
      for (int64_t j = c.S - 37; j < c.S; ++j) m[size_t(j)] = 0;  // row 0: padding at the end
      for (int64_t j = 0; j < c.S; ++j) m[size_t(c.S + j)] = 0;   // row 1: nothing to attend
      p.mask_or_segments = Tensor::from_vector(m, {c.B, c.S});
    }
  }
  p.positions = Tensor::from_vector(positions, {int64_t(positions.size())});
  p.q = bf16_values(shape, 1);
  p.k = bf16_values(shape, 2);
  p.v = bf16_values(shape, 3);
  p.grad_out = bf16_values(shape, 4);
  return p;
}

struct Result {
  Tensor out, lse, bits, dq, dk, dv;
};

inline kernels::AttentionParams params_of(const Case& c, const Problem& p) {
  kernels::AttentionParams params;
  params.scale = 0.125;
  params.dropout_p = c.dropout;
  params.dropout = DropoutKey{17, 3, 5, 2};
  params.longest_segment = c.token_stream ? p.longest : 0;
  return params;
}

// The case's RoPE table [2, P, D / 2] in `dtype` (undefined without RoPE).
inline Tensor rope_table_of(const Case& c, const Problem& p, Device device, DType dtype) {
  return c.rope ? rope_table(p.positions.to(device), c.D, 10000.0, dtype) : Tensor();
}

// Outputs in `dtype` poisoned with NaN (keep bits: all ones), so an element
// the kernels leave unwritten shows.
inline Result poisoned_result(const Case& c, const Problem& p, Device device, DType dtype) {
  const Shape rows = c.token_stream ? Shape{p.tokens, c.H} : Shape{c.B, c.H, c.S};
  Shape bits_shape = rows;
  bits_shape.push_back((p.longest + 31) / 32);
  const Shape full = p.q.shape();
  auto poisoned = [&](const Shape& shape) { return Tensor::full(shape, NAN, dtype, device); };
  Result r;
  r.out = poisoned(full);
  r.lse = poisoned(rows);
  r.bits = c.dropout > 0 ? Tensor::full(bits_shape, -1.0, DType::i32, device) : Tensor();
  r.dq = poisoned(full);
  r.dk = poisoned(full);
  r.dv = poisoned(full);
  return r;
}

// Forward and backward of the case's kernels on `device` with operands of
// `dtype` (f32 or f64 on the CPU, bf16 on the GPU); outputs f32 (f64 for
// f64), poisoned first.
inline Result run(const Case& c, const Problem& p, Device device, DType dtype) {
  const kernels::AttentionParams params = params_of(c, p);
  auto in = [&](const Tensor& t) { return t.to(dtype).to(device); };
  const DType result = dtype == DType::f64 ? DType::f64 : DType::f32;  // out, lse, grads, table
  const Tensor q = in(p.q), k = in(p.k), v = in(p.v), grad_out = in(p.grad_out);
  const Tensor extra = p.mask_or_segments.defined() ? p.mask_or_segments.to(device) : Tensor();
  const Tensor table = rope_table_of(c, p, device, result);
  const bool interleaved = c.layout == RopeLayout::interleaved;
  Result r = poisoned_result(c, p, device, result);
  if (c.rope) {
    launch::rope_attention_forward(device, params, table, interleaved, q, k, v, extra, r.out, r.lse,
                                   r.bits);
    launch::rope_attention_backward(device, params, table, interleaved, q, k, v, extra, r.out,
                                    r.lse, r.bits, grad_out, r.dq, r.dk, r.dv);
  } else if (c.token_stream) {
    launch::attention_varlen_forward(device, params, q, k, v, extra, r.out, r.lse, r.bits);
    launch::attention_varlen_backward(device, params, q, k, v, extra, r.out, r.lse, r.bits,
                                      grad_out, r.dq, r.dk, r.dv);
  } else {
    launch::attention_forward(device, params, q, k, v, extra, r.out, r.lse, r.bits);
    launch::attention_backward(device, params, q, k, v, extra, r.out, r.lse, r.bits, grad_out, r.dq,
                               r.dk, r.dv);
  }
  return r;
}

// The rows (flat indices of [rows..., D] / [rows...]) a token stream's kernel
// writes: tokens inside a segment; every row when padded.
inline std::vector<int64_t> written_tokens(const Case& c, const Problem& p) {
  std::vector<int64_t> out;
  if (!c.token_stream) return out;
  for (const auto& s : p.segments)
    for (int64_t t = s[0]; t < s[0] + s[1]; ++t) out.push_back(t);
  return out;
}

// Only the written part of a tensor whose first dimension is the token.
inline std::vector<double> restrict(const std::vector<double>& x,
                                    const std::vector<int64_t>& tokens, int64_t per_token) {
  if (tokens.empty()) return x;
  std::vector<double> out;
  for (int64_t t : tokens)
    out.insert(out.end(), x.begin() + t * per_token, x.begin() + (t + 1) * per_token);
  return out;
}

// `gpu` (the result under test) against `cpu` (the reference).
inline void expect_match(const Case& c, const Problem& p, const Result& gpu, const Result& cpu) {
  const std::vector<int64_t> tokens = written_tokens(c, p);
  const int64_t per_row = c.H * c.D;
  auto compare = [&](const Tensor& a, const Tensor& b, const char* what, double tol) {
    const double err =
        relative_error(restrict(host(a), tokens, per_row), restrict(host(b), tokens, per_row));
    EXPECT_LT(err, tol) << what << " of " << c.name;
  };
  compare(gpu.out, cpu.out, "out", 2e-2);
  compare(gpu.dq, cpu.dq, "dq", 4e-2);
  compare(gpu.dk, cpu.dk, "dk", 4e-2);
  compare(gpu.dv, cpu.dv, "dv", 4e-2);
  // lse: equal within f32 rounding of the scores, -inf exactly where the CPU's is.
  const auto lse_gpu = restrict(host(gpu.lse), tokens, c.H);
  const auto lse_cpu = restrict(host(cpu.lse), tokens, c.H);
  for (size_t i = 0; i < lse_cpu.size(); ++i) {
    if (std::isinf(lse_cpu[i])) {
      EXPECT_TRUE(std::isinf(lse_gpu[i]) && lse_gpu[i] < 0) << "lse " << i << " of " << c.name;
    } else {
      EXPECT_NEAR(lse_gpu[i], lse_cpu[i], 1e-2 * (1.0 + std::abs(lse_cpu[i])))
          << "lse " << i << " of " << c.name;
    }
  }
  if (c.dropout > 0) {
    // Every word the CPU writes, bit for bit.
    const int64_t W = (p.longest + 31) / 32;
    const auto bits_gpu = gpu.bits.to(Device::cpu()).to_vector<int32_t>();
    const auto bits_cpu = cpu.bits.to_vector<int32_t>();
    int64_t compared = 0;
    auto check_row = [&](int64_t row, int64_t keys) {
      for (int64_t w = 0; w < (keys + 31) / 32; ++w, ++compared)
        ASSERT_EQ(bits_gpu[size_t(row * W + w)], bits_cpu[size_t(row * W + w)])
            << "keep word " << w << " of row " << row << " of " << c.name;
    };
    if (c.token_stream) {
      for (const auto& s : p.segments)
        for (int64_t t = s[0]; t < s[0] + s[1]; ++t)
          for (int64_t h = 0; h < c.H; ++h) check_row(t * c.H + h, s[1]);
    } else {
      for (int64_t row = 0; row < c.B * c.H * c.S; ++row) check_row(row, c.S);
    }
    EXPECT_GT(compared, 0);
  }
}

// Two runs of the kernels under the two variants (the forward's tilings, the
// dq pass's blocks an SM) compute every row the same way: out, lse, the keep
// bits and the gradients must be the same bits (compared as bit patterns, so
// elements no segment covers, still NaN, compare too).
inline void expect_same_results(const Result& a, const Result& b) {
  auto bits_of = [](const Tensor& t) {
    const std::vector<float> v = t.to(Device::cpu()).to_vector<float>();
    std::vector<uint32_t> w(v.size());
    std::memcpy(w.data(), v.data(), v.size() * sizeof(float));
    return w;
  };
  EXPECT_EQ(bits_of(a.out), bits_of(b.out)) << "the tilings' outputs differ";
  EXPECT_EQ(bits_of(a.lse), bits_of(b.lse)) << "the tilings' lse differ";
  EXPECT_EQ(bits_of(a.dq), bits_of(b.dq)) << "the variants' dq differ";
  EXPECT_EQ(bits_of(a.dk), bits_of(b.dk)) << "the variants' dk differ";
  EXPECT_EQ(bits_of(a.dv), bits_of(b.dv)) << "the variants' dv differ";
  if (a.bits.defined()) {  // with dropout
    EXPECT_EQ(a.bits.to(Device::cpu()).to_vector<int32_t>(),
              b.bits.to(Device::cpu()).to_vector<int32_t>());
  }
}

// The flash kernels' process-wide variants for one scope (read by the Get
// functions, set by the Set ones): variant 0 is the defaults (16 rows a
// warp forward, 2 dq blocks an SM), variant 1 the others (32 rows, 1 block).
template <int (*GetRows)(), void (*SetRows)(int), int (*GetDq)(), void (*SetDq)(int)>
class ScopedFlashVariant {
 public:
  explicit ScopedFlashVariant(int variant) : rows_(GetRows()), dq_(GetDq()) {
    SetRows(variant == 0 ? 16 : 32);
    SetDq(variant == 0 ? 2 : 1);
  }
  ~ScopedFlashVariant() {
    SetRows(rows_);
    SetDq(dq_);
  }
  ScopedFlashVariant(const ScopedFlashVariant&) = delete;
  ScopedFlashVariant& operator=(const ScopedFlashVariant&) = delete;

 private:
  int rows_, dq_;
};

// Runs `run` under both variants (a Scoped sets one for its scope), and
// checks each result against the CPU's and the two against each other.
template <class Scoped, class Run>
void expect_both_variants_match(const Case& c, const Problem& p, const Result& cpu, Run run) {
  Result by_variant[2];
  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE(i == 0 ? "16 rows per warp, dq 2 blocks an SM" : "32 rows, dq 1 block");
    const Scoped variant(i);
    by_variant[i] = run();
    expect_match(c, p, by_variant[i], cpu);
  }
  expect_same_results(by_variant[0], by_variant[1]);
}

inline std::vector<Case> cases() {
  std::vector<Case> out;
  const std::vector<std::vector<int64_t>> packed{{70, 1}, {130}, {45, 19, 64}};
  for (RopeLayout layout : {RopeLayout::interleaved, RopeLayout::half}) {
    const std::string l = layout == RopeLayout::interleaved ? "interleaved" : "half";
    out.push_back({.name = "padded_" + l, .rows = {}, .layout = layout});
    out.push_back({.name = "masked_dropout_" + l,
                   .rows = {},
                   .mask = true,
                   .dropout = 0.2,
                   .layout = layout});
    out.push_back({.name = "packed_" + l, .token_stream = true, .rows = packed, .layout = layout});
    out.push_back({.name = "packed_dropout_" + l,
                   .token_stream = true,
                   .rows = packed,
                   .dropout = 0.15,
                   .layout = layout});
  }
  out.push_back(
      {.name = "plain_masked_dropout", .rows = {}, .mask = true, .dropout = 0.1, .rope = false});
  out.push_back({.name = "plain_long", .B = 1, .S = 1000, .rows = {}, .rope = false});
  out.push_back({.name = "plain_packed_dropout",
                 .token_stream = true,
                 .rows = packed,
                 .dropout = 0.1,
                 .rope = false});
  out.push_back({.name = "fallback_head_dim_32_masked_dropout",
                 .rows = {},
                 .mask = true,
                 .dropout = 0.1,
                 .layout = RopeLayout::half,
                 .D = 32});
  out.push_back({.name = "fallback_head_dim_32_packed",
                 .token_stream = true,
                 .rows = packed,
                 .dropout = 0.1,
                 .rope = false,
                 .D = 32});
  return out;
}

}  // namespace roformer::testing::flash
