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
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <ostream>
#include <string>
#include <vector>

#include "core/cuda/kernels/forward_schedule.h"
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
  // Scores that jump by over 2^11 from key tile to key tile (padded, no
  // RoPE): every query's first feature 8, every key's 8 times its tile
  // index, so each tile's max moves the row's reference max (the kernels
  // rescale lazily; random scores never move it that far). The factor 64
  // sits mostly in q's constant, not in the keys' column: that column, shared
  // by a tile's keys, turns dq's bf16 rounding of dS into an error of dq as
  // large as it (with q 1 and keys 64 times their tile, up to 192 at S = 200,
  // dq failed its tolerance on the H200 and emulated).
  bool growing_scores = false;
  // With RoPE: q and k rotated once, as the op does on token streams
  // (set_rotate_once): the rope kernel's copies, the plain forward on them,
  // and the rope_attention backward taking them (RopeInputs::rotated), which
  // rotates dq and dk back as it writes them.
  bool rotated_inputs = false;
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
  if (c.growing_scores) {
    std::vector<float> q = p.q.to_vector<float>(), k = p.k.to_vector<float>();
    for (size_t row = 0; row < q.size() / size_t(c.D); ++row) {  // [B, H, S, D]
      q[row * size_t(c.D)] = 8.0f;
      k[row * size_t(c.D)] = 8.0f * float(int64_t(row) % c.S / 64);
    }
    p.q = Tensor::from_vector(q, shape);
    p.k = Tensor::from_vector(k, shape);
  }
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
  if (c.rope && c.rotated_inputs) {
    const Tensor rq = rotated_once(q, table, interleaved);
    const Tensor rk = rotated_once(k, table, interleaved);
    if (c.token_stream)
      launch::attention_varlen_forward(device, params, rq, rk, v, extra, r.out, r.lse, r.bits);
    else
      launch::attention_forward(device, params, rq, rk, v, extra, r.out, r.lse, r.bits);
    launch::rope_attention_backward(device, params, table, interleaved,
                                    kernels::RopeInputs::rotated, rq, rk, v, extra, r.out, r.lse,
                                    r.bits, grad_out, r.dq, r.dk, r.dv);
  } else if (c.rope) {
    launch::rope_attention_forward(device, params, table, interleaved, q, k, v, extra, r.out, r.lse,
                                   r.bits);
    launch::rope_attention_backward(device, params, table, interleaved,
                                    kernels::RopeInputs::unrotated, q, k, v, extra, r.out, r.lse,
                                    r.bits, grad_out, r.dq, r.dk, r.dv);
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

using kernels::cuda::ForwardSchedule;

// The flash kernels' process-wide settings (flash_attention.h): forward
// rows a warp, the two-pass dq blocks an SM, backward passes, fused splits,
// the forward on wgmma (Hopper), the fused backward on wgmma, the wgmma
// forward's schedule, its keep bits drawn ahead.
struct FlashSettings {
  int rows = 16, dq_blocks = 2, passes = 1, splits = 0;
  const char* what = "";
  bool wgmma = false, wgmma_backward = false;
  ForwardSchedule schedule = ForwardSchedule::automatic;
  bool bits_ahead = true;
  bool alternate_sweeps = false;
};

// The wgmma forward and fused backward with the automatic split count: the
// defaults on compute capability 9.0 (skipped elsewhere).
inline FlashSettings wgmma_variant() {
  return {16, 2, 1, 0, "wgmma forward and fused backward (the defaults on 9.0)", true, true};
}

// mma.sync with the other defaults: every GPU's kernels.
inline FlashSettings mma_sync_variant() {
  return {16, 2, 1, 0, "mma.sync: 16 rows a warp, fused backward, automatic splits"};
}

// The settings each test runs under: the defaults of an H100 (wgmma) and of
// every other GPU (mma.sync) first, then the wgmma forward pipelined
// throughout (the default pipelines only the forwards without RoPE inside),
// the two-pass backward and the other variants: the forward in step
// throughout, the keep bits drawn inside the forward, the backward's sweeps
// alternating.
// ROFORMER_FLASH_VARIANTS=N keeps the first N (scripts/gpu_check.sh
// racechecks the first three: a sanitizer's slowdown times thirteen is too long).
inline std::vector<FlashSettings> flash_variants() {
  std::vector<FlashSettings> all{
      wgmma_variant(),
      mma_sync_variant(),
      {16, 2, 1, 0, "wgmma forward pipelined, fused backward on wgmma", true, true,
       ForwardSchedule::pipelined},
      {16, 2, 2, 0, "two-pass backward, dq 2 blocks an SM"},
      {32, 1, 2, 0, "32 rows a warp, two-pass backward, dq 1 block an SM"},
      {16, 2, 1, 1, "fused backward, one split"},
      {16, 2, 1, 3, "fused backward, three splits (at most the key tiles)"},
      {16, 2, 1, 0, "wgmma forward, fused backward", true},
      {16, 2, 1, 3, "wgmma forward in step and fused backward, three splits", true, true,
       ForwardSchedule::in_step},
      {16, 2, 1, 0, "wgmma forward pipelined, keep bits drawn inside, fused backward on wgmma",
       true, true, ForwardSchedule::pipelined, false},
      {16, 2, 1, 3, "wgmma forward in step, keep bits drawn inside, fused backward, three splits",
       true, true, ForwardSchedule::in_step, false},
      {16, 2, 1, 1, "wgmma forward and backward, one split", true, true},
      {16, 2, 1, 1, "wgmma forward and backward, one split, the sweeps alternating", true, true,
       ForwardSchedule::automatic, true, true}};
  if (const char* keep = std::getenv("ROFORMER_FLASH_VARIANTS")) {
    const long n = std::strtol(keep, nullptr, 10);
    if (n >= 1 && n < long(all.size())) all.resize(size_t(n));
  }
  return all;
}

// The getters and setters of one build of the kernels (the GPU's, or the
// emulator's simt_ names).
struct FlashKnobs {
  int (*rows)();
  void (*set_rows)(int);
  int (*dq_blocks)();
  void (*set_dq_blocks)(int);
  int (*passes)();
  void (*set_passes)(int);
  int (*splits)();
  void (*set_splits)(int);
  bool (*wgmma)();
  void (*set_wgmma)(bool);
  bool (*wgmma_backward)();
  void (*set_wgmma_backward)(bool);
  bool (*wgmma_available)(int device);
  ForwardSchedule (*schedule)();
  void (*set_schedule)(ForwardSchedule);
  bool (*bits_ahead)();
  void (*set_bits_ahead)(bool);
  bool (*alternate_sweeps)();
  void (*set_alternate_sweeps)(bool);
};

// Sets `settings` for its scope and restores what was set before.
class ScopedFlashSettings {
 public:
  ScopedFlashSettings(const FlashKnobs& knobs, const FlashSettings& settings)
      : knobs_(knobs),
        saved_{knobs.rows(),
               knobs.dq_blocks(),
               knobs.passes(),
               knobs.splits(),
               "",
               knobs.wgmma(),
               knobs.wgmma_backward(),
               knobs.schedule(),
               knobs.bits_ahead(),
               knobs.alternate_sweeps()} {
    apply(settings);
  }
  ~ScopedFlashSettings() { apply(saved_); }
  ScopedFlashSettings(const ScopedFlashSettings&) = delete;
  ScopedFlashSettings& operator=(const ScopedFlashSettings&) = delete;

 private:
  void apply(const FlashSettings& s) {
    knobs_.set_rows(s.rows);
    knobs_.set_dq_blocks(s.dq_blocks);
    knobs_.set_passes(s.passes);
    knobs_.set_splits(s.splits);
    knobs_.set_wgmma(s.wgmma);
    knobs_.set_wgmma_backward(s.wgmma_backward);
    knobs_.set_schedule(s.schedule);
    knobs_.set_bits_ahead(s.bits_ahead);
    knobs_.set_alternate_sweeps(s.alternate_sweeps);
  }
  FlashKnobs knobs_;
  FlashSettings saved_;
};

inline std::vector<uint32_t> bits_of(const Tensor& t) {
  const std::vector<float> v = t.to(Device::cpu()).to_vector<float>();
  std::vector<uint32_t> w(v.size());
  std::memcpy(w.data(), v.data(), v.size() * sizeof(float));
  return w;
}

// Two runs' gradient `what`, element for element within f32 summation
// order, NaN where the other is NaN (elements no segment covers).
inline void expect_close_where_written(const Tensor& a, const Tensor& b, const char* what) {
  const auto x = host(a), y = host(b);
  std::vector<double> written_x, written_y;  // the elements a segment covers
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(std::isnan(x[i]), std::isnan(y[i])) << what << " element " << i;
    if (std::isnan(x[i])) continue;
    written_x.push_back(x[i]);
    written_y.push_back(y[i]);
  }
  EXPECT_LT(relative_error(written_x, written_y), 1e-3) << "the variants' " << what << " differ";
}

// Runs of the kernels under two settings compute out, lse, the keep bits,
// dk and dv the same way: the same bits (compared as bit patterns, so
// elements no segment covers, still NaN, compare too). dq is the same bits
// when both runs sum it the same way (`same_dq`: two passes both), and
// otherwise close, NaN where the other is NaN: the schemes' scores differ in
// f32 rounding (S = Q K^T against S^T = K Q^T, a bias added or not), which
// can move a dS element across a bf16 rounding boundary (seen: 5e-5), and
// their f32 sums of dS K run in another order. dk and dv likewise, with
// `same_key_grads` false: the query tiles summed in another order.
inline void expect_same_results(const Result& a, const Result& b, bool same_dq,
                                bool same_key_grads = true) {
  EXPECT_EQ(bits_of(a.out), bits_of(b.out)) << "the tilings' outputs differ";
  EXPECT_EQ(bits_of(a.lse), bits_of(b.lse)) << "the tilings' lse differ";
  if (same_key_grads) {
    EXPECT_EQ(bits_of(a.dk), bits_of(b.dk)) << "the variants' dk differ";
    EXPECT_EQ(bits_of(a.dv), bits_of(b.dv)) << "the variants' dv differ";
  } else {
    expect_close_where_written(a.dk, b.dk, "dk");
    expect_close_where_written(a.dv, b.dv, "dv");
  }
  if (same_dq)
    EXPECT_EQ(bits_of(a.dq), bits_of(b.dq)) << "the variants' dq differ";
  else
    expect_close_where_written(a.dq, b.dq, "dq");
  if (a.bits.defined()) {  // with dropout
    EXPECT_EQ(a.bits.to(Device::cpu()).to_vector<int32_t>(),
              b.bits.to(Device::cpu()).to_vector<int32_t>());
  }
}

// Runs `run` under every variant's settings, and checks each result against
// the CPU's and against the first mma.sync variant's run; the two-pass runs'
// dq against each other bit for bit too, and the other wgmma backward runs
// against the first (the forward's schedules give the same bits). The
// mma.sync variants run first.
// The wgmma products may sum in another order than mma.sync's: their
// results are held to the CPU's tolerances and that run's keep bits; they
// are left out (saying so) where the device (0) cannot run them.
template <class Run>
void expect_variants_match(const FlashKnobs& knobs, const Case& c, const Problem& p,
                           const Result& cpu, Run run) {
  const std::vector<FlashSettings> variants = flash_variants();
  std::vector<size_t> order;
  for (const bool wgmma : {false, true})
    for (size_t i = 0; i < variants.size(); ++i)
      if (variants[i].wgmma == wgmma) order.push_back(i);
  Result defaults, two_pass, wgmma_backward;
  FlashSettings first_wgmma_backward;
  for (const size_t i : order) {
    SCOPED_TRACE(variants[i].what);
    if (variants[i].wgmma && !knobs.wgmma_available(0)) {
      std::cout << "[ SKIPPED  ] " << variants[i].what
                << ": the device is not compute capability 9.0\n";
      continue;
    }
    const ScopedFlashSettings scoped(knobs, variants[i]);
    Result r = run();
    expect_match(c, p, r, cpu);
    if (!variants[i].wgmma && !defaults.out.defined()) {
      defaults = r;
    } else if (variants[i].wgmma) {
      if (r.bits.defined() && defaults.bits.defined()) {
        EXPECT_EQ(r.bits.to(Device::cpu()).to_vector<int32_t>(),
                  defaults.bits.to(Device::cpu()).to_vector<int32_t>());
      }
      // The wgmma backward's split counts: dk and dv the same bits, dq
      // within f32 summation order, as on mma.sync. Another forward
      // schedule with the first's backward (passes, splits): every output
      // the same bits, dq too. Alternating sweeps: dk and dv within f32
      // summation order.
      if (variants[i].wgmma_backward) {
        if (wgmma_backward.dq.defined()) {
          const FlashSettings& f = first_wgmma_backward;
          expect_same_results(r, wgmma_backward,
                              variants[i].splits == f.splits && variants[i].passes == f.passes,
                              variants[i].alternate_sweeps == f.alternate_sweeps);
        } else {
          wgmma_backward = r;
          first_wgmma_backward = variants[i];
        }
      }
    } else {
      expect_same_results(r, defaults, false);
    }
    if (variants[i].passes == 2) {
      if (two_pass.dq.defined())
        expect_same_results(r, two_pass, true);
      else
        two_pass = r;
    }
  }
}

// The fused wgmma backward with its sweeps alternating, against the same
// split count with them all upwards (each of `split_counts`: one split, a
// block takes every key tile): dq the same bits (each row adds the key
// tiles in order), dk and dv within f32 summation order but not the same
// bits (the query tiles summed in another order: were they the same, no
// sweep ran downwards). Each split needs two key tiles or more.
template <class Run>
void expect_alternating_sweeps_keep_dq(const FlashKnobs& knobs,
                                       const std::vector<int>& split_counts, Run run) {
  for (const int splits : split_counts) {
    SCOPED_TRACE("splits " + std::to_string(splits));
    FlashSettings upwards{16, 2, 1, splits, "sweeps upwards", true, true};
    FlashSettings alternating = upwards;
    alternating.alternate_sweeps = true;
    Result a, b;
    {
      const ScopedFlashSettings scoped(knobs, upwards);
      a = run();
    }
    {
      const ScopedFlashSettings scoped(knobs, alternating);
      b = run();
    }
    expect_same_results(a, b, true, false);
    EXPECT_NE(bits_of(a.dk), bits_of(b.dk)) << "dk the same bits: no sweep ran downwards";
  }
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
  // q and k rotated once: a token stream with dropout in the interleaved
  // layout (the model's training step: set_rotate_once, the default), and a
  // padded batch in the half layout.
  out.push_back({.name = "packed_dropout_rotated_once_interleaved",
                 .token_stream = true,
                 .rows = packed,
                 .dropout = 0.15,
                 .rotated_inputs = true});
  out.push_back({.name = "masked_rotated_once_half",
                 .rows = {},
                 .mask = true,
                 .layout = RopeLayout::half,
                 .rotated_inputs = true});
  // Sequences of whole key tiles: the last one full, reached through the
  // pipelined forward's loop.
  out.push_back({.name = "packed_whole_tiles_dropout_half",
                 .token_stream = true,
                 .rows = {{128, 64}, {192}},
                 .dropout = 0.1,
                 .layout = RopeLayout::half});
  out.push_back(
      {.name = "plain_masked_dropout", .rows = {}, .mask = true, .dropout = 0.1, .rope = false});
  // Neither RoPE nor dropout: the inference forwards the default pipelines
  // (the key mask's biases and the segments through its loop).
  out.push_back({.name = "plain_masked", .rows = {}, .mask = true, .rope = false});
  out.push_back({.name = "plain_packed", .token_stream = true, .rows = packed, .rope = false});
  out.push_back({.name = "plain_long", .B = 1, .S = 1000, .rows = {}, .rope = false});
  out.push_back(
      {.name = "plain_growing_scores", .rows = {}, .rope = false, .growing_scores = true});
  out.push_back({.name = "plain_packed_dropout",
                 .token_stream = true,
                 .rows = packed,
                 .dropout = 0.1,
                 .rope = false});
  // Dropout over a half: the kernels decide such draws another way.
  out.push_back({.name = "plain_packed_heavy_dropout",
                 .token_stream = true,
                 .rows = packed,
                 .dropout = 0.6,
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
