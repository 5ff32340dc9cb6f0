// The row and reduction kernels' own source (core/cuda/kernels/reduce.cu,
// column_sums.cuh, layer_norm.cu, softmax.cu, cross_entropy.cu) run through
// the SIMT emulator against the CPU kernels on the same inputs, outputs
// poisoned first. Shapes cross the kernels' tiles: 256-thread rows and column
// blocks, 64-row chunks with a partial last one. No GPU needed.
#include <gtest/gtest.h>

#include "core/ops.h"
#include "tests/simt/emulated_test_support.h"

namespace roformer {
namespace {

using namespace testing::emulated;
namespace cpu = kernels::cpu;
namespace emu = kernels::simt_cuda;

const DType kFloats[] = {DType::f32, DType::bf16, DType::f64};

std::string name_of(DType t, const Shape& shape) {
  std::string s = std::string(dtype_name(t)) + " [";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// --- sum ------------------------------------------------------------------------------
Shape kept_shape(const Shape& shape, uint32_t mask) {
  Shape out = shape;
  for (size_t d = 0; d < shape.size(); ++d)
    if ((mask >> d) & 1u) out[d] = 1;
  return out;
}

void expect_sum_matches(const Tensor& x, uint32_t mask, const std::string& what) {
  SCOPED_TRACE(what + " " + name_of(x.dtype(), x.shape()) + " mask " + std::to_string(mask));
  const Shape out_shape = kept_shape(x.shape(), mask);
  const Tensor ref = poisoned(out_shape, x.dtype()), got = poisoned(out_shape, x.dtype());
  cpu::sum(cpu_stream(), kernel_tensor(x), mask, kernel_tensor(ref));
  EmulatedStream s;
  emu::sum(s.get(), kernel_tensor(x), mask, kernel_tensor(got));
  if (x.dtype() == DType::i64)
    expect_equal(got, ref, "sum");
  else
    expect_close(got, ref, x.dtype() == DType::f32 ? 1e-6 : tolerance(x.dtype()), "sum");
}

TEST(ReduceEmulated, SumOverLeadingDimsTakesTheTwoPassColumnSums) {
  for (DType t : {DType::f32, DType::bf16, DType::f64, DType::i64}) {
    const auto x = [&](const Shape& shape) {
      return t == DType::i64 ? random(shape, 1, DType::f64, 100.0).to(DType::i64)
                             : random(shape, 1, t);
    };
    expect_sum_matches(x({300, 70}), 0b1, "5 chunks, the last partial");
    expect_sum_matches(x({130, 300}), 0b1, "two column blocks");
    expect_sum_matches(x({3, 50, 20}), 0b11, "two leading dims");
    expect_sum_matches(x({128, 3}), 0b1, "chunks ending at the last row");
    expect_sum_matches(x({7, 5}), 0b11, "every dim: one column");
  }
}

TEST(ReduceEmulated, SumOfNoRowsIsZero) {
  expect_sum_matches(Tensor::zeros({0, 5}), 0b1, "no rows");
}

TEST(ReduceEmulated, SumOverOtherDimsTakesTheGeneralPath) {
  for (DType t : kFloats) {
    expect_sum_matches(random({20, 37}, 2, t), 0b10, "last dim");
    expect_sum_matches(random({4, 30, 5}, 3, t), 0b10, "middle dim");
    expect_sum_matches(random({4, 30, 5}, 3, t), 0b101, "outer dims");
    expect_sum_matches(random({40, 30}, 4, t).transpose(0, 1), 0b1, "transposed");
    expect_sum_matches(random({40, 30}, 5, t).narrow(1, 3, 20), 0b1, "sliced");
  }
}

// --- max and its scatter ---------------------------------------------------------------
void expect_max_matches(const Tensor& x, int32_t dim, const std::string& what) {
  SCOPED_TRACE(what + " " + name_of(x.dtype(), x.shape()) + " dim " + std::to_string(dim));
  const Shape out_shape = kept_shape(x.shape(), 1u << dim);
  const Tensor ref = poisoned(out_shape, x.dtype()), got = poisoned(out_shape, x.dtype());
  const Tensor ref_i = poisoned(out_shape, DType::i64), got_i = poisoned(out_shape, DType::i64);
  cpu::max(cpu_stream(), kernel_tensor(x), dim, kernel_tensor(ref), kernel_tensor(ref_i));
  EmulatedStream s;
  emu::max(s.get(), kernel_tensor(x), dim, kernel_tensor(got), kernel_tensor(got_i));
  expect_equal(got, ref, "values");
  expect_equal(got_i, ref_i, "indices");
  // max's backward: the gradient lands at the argmax in a zeroed grad_x.
  const Tensor grad = random(out_shape, 9, x.dtype());
  const Tensor ref_g = Tensor::zeros(x.shape(), x.dtype()), got_g = ref_g.clone();
  cpu::scatter_along(cpu_stream(), kernel_tensor(grad), kernel_tensor(ref_i), dim,
                     kernel_tensor(ref_g));
  emu::scatter_along(s.get(), kernel_tensor(grad), kernel_tensor(got_i), dim, kernel_tensor(got_g));
  expect_equal(got_g, ref_g, "scatter_along");
}

TEST(ReduceEmulated, MaxAndScatterAlongMatchTheCpu) {
  for (DType t : kFloats) {
    expect_max_matches(random({5, 300}, 6, t), 1, "last dim");
    expect_max_matches(random({300, 5}, 7, t), 0, "first dim");
    expect_max_matches(random({6, 40, 3}, 8, t), 1, "middle dim");
    expect_max_matches(random({40, 30}, 9, t).transpose(0, 1), 1, "transposed");
  }
  // Ties give the first index; NaN wins.
  std::vector<double> v(60, 1.0);
  v[7] = 2.0;
  v[9] = 2.0;
  v[30 + 4] = NAN;
  v[30 + 20] = 5.0;
  expect_max_matches(Tensor::from_vector(v, {2, 30}), 1, "ties and NaN");
  // The same over rows of 32 and more (one warp per row): ties across lanes,
  // a NaN after a larger value, two NaNs, a row of equal values.
  std::vector<double> w(4 * 97, 0.5);
  w[3] = 4.0, w[35] = 4.0, w[68] = 4.0;                 // lanes 3 and 3 again, and 4
  w[97 + 40] = 9.0, w[97 + 70] = NAN, w[97 + 6] = NAN;  // the first NaN (6)
  w[2 * 97 + 96] = 3.0;                                 // the last element
  w[3 * 97 + 45] = NAN, w[3 * 97 + 10] = NAN;           // NaNs in two lanes: the first (10)
  expect_max_matches(Tensor::from_vector(w, {4, 97}), 1, "long rows: ties and NaN");
  expect_max_matches(Tensor::from_vector(w, {97, 4}), 0, "long columns: ties and NaN");
  for (DType t : kFloats) expect_max_matches(random({3, 1000, 2}, 10, t), 1, "long, strided");
}

// --- layer norm ---------------------------------------------------------------------------
struct LayerNormOut {
  Tensor y, mean, var, dx, dweight, dbias, sum, dx_x, y_low;
};

// A residual dropout (x dropped before the add): the kernels' argument and
// where x's rows are (tokens [rows, 2] i64, or undefined for `positions`).
struct DropCase {
  kernels::ResidualDropout drop;
  Tensor tokens;
};

LayerNormOut layer_norm_on(bool emulated, const Tensor& x, const Tensor& w, const Tensor& b,
                           const Tensor& dy, bool dweight, bool dbias,
                           const Tensor& residual = Tensor(), const DropCase& dc = {}) {
  const int64_t cols = x.shape().back(), rows = x.numel() / cols;
  // The residual's dtype where x is bf16 on an f32 residual stream.
  const DType t = residual.defined() ? residual.dtype() : x.dtype();
  const DType stat = t == DType::f64 ? DType::f64 : DType::f32;
  LayerNormOut o{
      poisoned(x.shape(), t), poisoned({rows}, stat), poisoned({rows}, stat),
      poisoned(x.shape(), t), dweight ? poisoned({cols}, t) : Tensor(),
      dbias ? poisoned({cols}, t) : Tensor(),
      residual.defined() ? poisoned(x.shape(), t) : Tensor(),
      // x's own gradient: bf16 beside the f32 one (add_layer_norm's bf16 x),
      // or dropped by the residual dropout
      (x.dtype() == DType::bf16 && t == DType::f32) || dc.drop.p > 0.0
          ? poisoned(x.shape(), x.dtype())
          : Tensor(),
      // y's bf16 copy beside an f32 y on a residual (bf16 activations)
      residual.defined() && t == DType::f32 ? poisoned(x.shape(), DType::bf16) : Tensor()};
  EmulatedStream s;
  const kernels::Stream stream = emulated ? s.get() : cpu_stream();
  auto* forward = emulated ? &emu::layer_norm_forward : &cpu::layer_norm_forward;
  auto* backward = emulated ? &emu::layer_norm_backward : &cpu::layer_norm_backward;
  const double eps = 1e-5;
  forward(stream, kernel_tensor(x), kernel_tensor(residual), kernel_tensor(w), kernel_tensor(b),
          eps, dc.drop, kernel_tensor(dc.tokens), kernel_tensor(o.y), kernel_tensor(o.y_low),
          kernel_tensor(o.sum), kernel_tensor(o.mean), kernel_tensor(o.var));
  // Both backwards read the CPU's statistics, so they differ only by their own work.
  const Tensor& normalised = residual.defined() ? o.sum : x;
  backward(stream, kernel_tensor(normalised), kernel_tensor(w), kernel_tensor(o.mean),
           kernel_tensor(o.var), kernel_tensor(dy), eps, dc.drop, kernel_tensor(dc.tokens),
           kernel_tensor(o.dx), kernel_tensor(o.dx_x), kernel_tensor(o.dweight),
           kernel_tensor(o.dbias));
  return o;
}

// dropout() (the op, on the CPU) of t with the case's site and draws.
Tensor dropped(const Tensor& t, const DropCase& dc) {
  const kernels::ResidualDropout& d = dc.drop;
  DropoutContext ctx{d.key.seed, d.key.step, d.key.first_sequence, d.key.site};
  if (dc.tokens.defined()) return dropout(t, d.p, true, ctx, dc.tokens);
  const int64_t cols = t.shape().back(), rows = t.numel() / cols;
  return dropout(t.reshape({rows / d.positions, d.positions, cols}), d.p, true, ctx)
      .reshape(t.shape());
}

// bf16_x: x in bf16 on a residual (and all the rest) in t = f32; `dc` a
// residual dropout (with `residual`).
void expect_layer_norm_matches(const Shape& shape, DType t, bool affine, bool dweight, bool dbias,
                               bool residual = false, bool bf16_x = false,
                               const DropCase& dc = {}) {
  SCOPED_TRACE(name_of(t, shape) + (affine ? " affine" : "") + (dweight ? " dweight" : "") +
               (dbias ? " dbias" : "") + (residual ? " residual" : "") + (bf16_x ? " bf16 x" : "") +
               (dc.drop.p > 0.0 ? (dc.tokens.defined() ? " dropout (tokens)" : " dropout") : ""));
  const int64_t cols = shape.back();
  const Tensor x = random(shape, 11, bf16_x ? DType::bf16 : t, 3.0, 1.0);
  const Tensor dy = random(shape, 12, t);
  const Tensor w = affine ? random({cols}, 13, t) : Tensor();
  const Tensor b = affine ? random({cols}, 14, t) : Tensor();
  const Tensor r = residual ? random(shape, 15, t, 2.0) : Tensor();
  const LayerNormOut ref = layer_norm_on(false, x, w, b, dy, dweight, dbias, r, dc);
  const LayerNormOut got = layer_norm_on(true, x, w, b, dy, dweight, dbias, r, dc);
  const double tol = tolerance(t);
  if (residual && x.numel() > 0) expect_equal(got.sum, ref.sum, "sum");  // one rounding each
  if (got.y_low.defined() && x.numel() > 0) {  // each kernel's own y rounded once
    expect_equal(got.y_low, got.y.to(DType::bf16), "y_low");
    expect_equal(ref.y_low, ref.y.to(DType::bf16), "y_low (cpu)");
  }
  if (dc.drop.p > 0.0 && x.numel() > 0) {
    // dropout() then the residual add, bit for bit; x's gradient is each
    // kernel's own dx in x's dtype through dropout()'s backward.
    NoGradGuard no_grad;
    expect_equal(ref.sum, add(dropped(x, dc).to(t), r), "sum of dropout(x) and the residual");
    expect_equal(got.dx_x, dropped(got.dx.to(x.dtype()), dc), "dx_x");
    expect_equal(ref.dx_x, dropped(ref.dx.to(x.dtype()), dc), "dx_x (cpu)");
  }
  if (x.numel() > 0) {
    expect_close(got.y, ref.y, tol, "y");
    expect_close(got.mean, ref.mean, t == DType::f64 ? 1e-12 : 1e-5, "mean");
    expect_close(got.var, ref.var, t == DType::f64 ? 1e-12 : 1e-5, "var");
    expect_close(got.dx, ref.dx, tol, "dx");
    // The bf16 copy is each kernel's own dx rounded once.
    if (bf16_x && !(dc.drop.p > 0.0)) {
      expect_equal(got.dx_x, got.dx.to(DType::bf16), "dx_x");
      expect_equal(ref.dx_x, ref.dx.to(DType::bf16), "dx_x (cpu)");
    }
  }
  if (dweight) expect_close(got.dweight, ref.dweight, tol, "dweight");
  if (dbias) expect_close(got.dbias, ref.dbias, tol, "dbias");
}

TEST(LayerNormEmulated, ForwardAndBackwardMatchTheCpu) {
  for (DType t : kFloats) {
    // 130 rows: two full 64-row chunks and a partial one; 300 columns: two
    // column blocks, and rows longer than a block's 256 threads.
    expect_layer_norm_matches({t == DType::f32 ? 130 : 70, 300}, t, true, true, true);
    expect_layer_norm_matches({2, 33, 48}, t, true, true, false);
    expect_layer_norm_matches({64, 40}, t, false, false, true);
    expect_layer_norm_matches({5, 40}, t, true, false, false);
    // The residual add fused in (the sum written for backward).
    expect_layer_norm_matches({t == DType::f32 ? 130 : 70, 300}, t, true, true, true, true);
    expect_layer_norm_matches({3, 48}, t, false, false, false, true);
  }
  // bf16 activations on an f32 residual stream: the sum formed in f32.
  expect_layer_norm_matches({130, 300}, DType::f32, true, true, true, true, true);
  expect_layer_norm_matches({5, 13}, DType::f32, false, false, false, true, true);
}

// Rows in whole 16-byte words of at most 1,024 columns take a warp each
// (1 to 4 packs of eight a lane; 768 is RoFormer-base's hidden size, 1,032
// one pack past the limit, which takes a block again).
TEST(LayerNormEmulated, WarpPerRowShapesMatchTheCpu) {
  for (DType t : kFloats) {
    for (int64_t cols : {8, 256, 264, 768, 1024, 1032}) {
      expect_layer_norm_matches({t == DType::f64 ? 3 : 11, cols}, t, true, true, true);
      expect_layer_norm_matches({5, cols}, t, cols != 768, false, false, true);
    }
  }
  expect_layer_norm_matches({9, 768}, DType::f32, true, true, true, true, true);
  expect_layer_norm_matches({9, 1024}, DType::f32, false, false, false, true, true);
}

// The warp-per-row backward sums the parameter gradients over its chunk of
// 16 rows as it goes: 150 rows are nine whole chunks and one of 6 over two
// blocks of 8 warps (the second with 6 warps idle), 40 rows two chunks and
// one of 8 (f32 on a residual with a bf16 x, and bf16); dweight alone and
// dbias alone take the same kernel.
TEST(LayerNormEmulated, WarpChunksSumTheParameterGradients) {
  expect_layer_norm_matches({150, 256}, DType::f32, true, true, true);
  // 38 chunks: the finish kernel's rows of threads take two chunks or one.
  expect_layer_norm_matches({600, 64}, DType::f32, true, true, true);
  expect_layer_norm_matches({40, 768}, DType::f32, true, true, true, true, true);
  expect_layer_norm_matches({40, 768}, DType::bf16, true, true, true);
  expect_layer_norm_matches({40, 64}, DType::f64, true, true, false);
  expect_layer_norm_matches({40, 64}, DType::f32, true, false, true);
}

// A residual dropout (dropout_add_layer_norm): x dropped as it is read and
// its gradient as it is written, by dropout()'s draws. Padded rows
// ([B, S, features] as rows of B x S: sequence r / S, position r % S, from
// first_sequence 3) and token streams (tokens out of order, two rows of one
// sequence); the warp kernels (768, 64 columns: packs of eight) and the
// block ones (300 and 13 columns); every dtype, and bf16 x on f32.
TEST(LayerNormEmulated, ResidualDropoutIsDropoutThenTheAdd) {
  const kernels::ResidualDropout padded{0.3, DropoutKey{11, 4, 3, 5}, 6};
  const auto stream_of = [](int64_t rows) {
    std::vector<int64_t> ids;
    for (int64_t r = 0; r < rows; ++r) ids.insert(ids.end(), {(r * 7) % 5, (r * 3) % 11});
    return Tensor::from_vector(ids, {rows, 2});
  };
  for (DType t : kFloats) {
    for (int64_t cols : {768, 64, 300, 13}) {
      expect_layer_norm_matches({12, cols}, t, true, true, true, true, false, {padded, Tensor()});
      expect_layer_norm_matches({10, cols}, t, cols != 64, false, false, true, false,
                                {{0.1, DropoutKey{2, 9, 0, 1}, 1}, stream_of(10)});
    }
  }
  for (int64_t cols : {768, 300})
    expect_layer_norm_matches({18, cols}, DType::f32, true, true, true, true, true,
                              {padded, Tensor()});
  expect_layer_norm_matches({10, 768}, DType::f32, true, true, true, true, true,
                            {{0.5, DropoutKey{2, 9, 7, 1}, 1}, stream_of(10)});
}

TEST(LayerNormEmulated, NoRowsGiveZeroParameterGradients) {
  expect_layer_norm_matches({0, 40}, DType::f32, true, true, true);
}

// --- softmax ----------------------------------------------------------------------------
TEST(SoftmaxEmulated, ForwardAndBackwardMatchTheCpu) {
  for (DType t : kFloats) {
    for (const Shape& shape : {Shape{7, 300}, Shape{3, 4, 33}, Shape{2, 1}}) {
      for (bool log : {false, true}) {
        SCOPED_TRACE(name_of(t, shape) + (log ? " log" : ""));
        const Tensor x = random(shape, 21, t, 4.0), dy = random(shape, 22, t);
        const Tensor ref_y = poisoned(shape, t), got_y = poisoned(shape, t);
        cpu::softmax_forward(cpu_stream(), kernel_tensor(x), kernel_tensor(ref_y), log);
        EmulatedStream s;
        emu::softmax_forward(s.get(), kernel_tensor(x), kernel_tensor(got_y), log);
        expect_close(got_y, ref_y, tolerance(t), "y");
        const Tensor ref_dx = poisoned(shape, t), got_dx = poisoned(shape, t);
        cpu::softmax_backward(cpu_stream(), kernel_tensor(ref_y), kernel_tensor(dy),
                              kernel_tensor(ref_dx), log);
        emu::softmax_backward(s.get(), kernel_tensor(ref_y), kernel_tensor(dy),
                              kernel_tensor(got_dx), log);
        expect_close(got_dx, ref_dx, tolerance(t), "dx");
      }
    }
  }
}

// --- cross-entropy ------------------------------------------------------------------------
struct CrossEntropyOut {
  Tensor lse, row_loss, loss, count, correct, grad;
  KernelError error;
};

CrossEntropyOut cross_entropy_on(bool emulated, const Tensor& logits, const Tensor& targets,
                                 int64_t ignore, const Tensor& grad_loss) {
  const int64_t rows = logits.shape()[0];
  const DType loss_dtype = logits.dtype() == DType::f64 ? DType::f64 : DType::f32;
  CrossEntropyOut o{poisoned({rows}, DType::f64),
                    poisoned({rows}, DType::f64),
                    poisoned({}, loss_dtype),
                    poisoned({}, DType::i64),
                    poisoned({}, DType::i64),
                    poisoned(logits.shape(), logits.dtype()),
                    KernelError{}};
  EmulatedStream s;
  const kernels::Stream stream = emulated ? s.get() : cpu_stream();
  auto* forward = emulated ? &emu::cross_entropy_forward : &cpu::cross_entropy_forward;
  auto* backward = emulated ? &emu::cross_entropy_backward : &cpu::cross_entropy_backward;
  const int32_t site = 42;
  forward(stream, kernel_tensor(logits), kernel_tensor(targets), ignore, site, kernel_tensor(o.lse),
          kernel_tensor(o.row_loss), kernel_tensor(o.loss), kernel_tensor(o.count),
          kernel_tensor(o.correct));
  backward(stream, kernel_tensor(logits), kernel_tensor(targets), ignore, kernel_tensor(o.lse),
           kernel_tensor(grad_loss), kernel_tensor(o.count), kernel_tensor(o.grad));
  if (emulated)
    o.error = s.record;
  else
    cpu::take_error(stream, &o.error);
  return o;
}

// Rows the kernels count and score: every 7th ignored, every 3rd aimed at
// its argmax (a hit), the others at an arbitrary column.
std::vector<int64_t> cross_entropy_targets(const Tensor& logits, int64_t ignore) {
  const int64_t rows = logits.shape()[0], cols = logits.shape()[1];
  const std::vector<int64_t> best = argmax(logits, 1).to_vector<int64_t>();
  std::vector<int64_t> targets(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    targets[size_t(r)] = r % 7 == 3 ? ignore : r % 3 == 0 ? best[size_t(r)] : (r * 37) % cols;
  return targets;
}

void expect_cross_entropy_matches(int64_t rows, int64_t cols, DType t, DType it) {
  const int64_t ignore = -100;
  SCOPED_TRACE(name_of(t, {rows, cols}) + " targets " + dtype_name(it));
  const Tensor logits = random({rows, cols}, 31, t, 3.0);
  const std::vector<int64_t> targets = cross_entropy_targets(logits, ignore);
  const Tensor tt = Tensor::from_vector(targets, {rows}).to(it);
  const Tensor grad_loss = Tensor::full({}, 0.75, t == DType::f64 ? DType::f64 : DType::f32);
  const CrossEntropyOut ref = cross_entropy_on(false, logits, tt, ignore, grad_loss);
  const CrossEntropyOut got = cross_entropy_on(true, logits, tt, ignore, grad_loss);
  const double tol = tolerance(t == DType::bf16 ? DType::f32 : t);  // lse, losses: f64 outputs
  expect_close(got.lse, ref.lse, tol, "lse");
  expect_close(got.row_loss, ref.row_loss, tol, "row_loss");
  expect_close(got.loss, ref.loss, tol, "loss");
  expect_equal(got.count, ref.count, "count");
  expect_equal(got.correct, ref.correct, "correct");
  // Every row aimed at its argmax hits (a random row has no ties), and few
  // others do.
  int64_t aimed = 0;
  for (int64_t r = 0; r < rows; ++r) aimed += r % 7 != 3 && r % 3 == 0;
  EXPECT_GE(ref.correct.item(), double(aimed));
  EXPECT_LT(ref.correct.item(), double(aimed) + 0.1 * double(rows));
  expect_close(got.grad, ref.grad, tolerance(t), "grad");
  EXPECT_EQ(got.error.raised, 0);
}

TEST(CrossEntropyEmulated, ForwardAndBackwardMatchTheCpu) {
  // 300 columns: bf16 rows are not whole 16-byte packs (one column a step),
  // f32 and f64 rows are.
  for (DType t : kFloats) expect_cross_entropy_matches(70, 300, t, DType::i64);
  expect_cross_entropy_matches(70, 300, DType::f32, DType::i32);
  // 600 packs of eight a row: two packs a step, then one, for each thread.
  for (DType t : kFloats) expect_cross_entropy_matches(9, 4800, t, DType::i64);
  // More rows than the finishing block's 1024 threads.
  expect_cross_entropy_matches(1100, 40, DType::f32, DType::i64);
}

// Ties, NaN and infinities, placed where different threads (and, in packs,
// different packs) hold them: the count follows argmax's rule (the first
// NaN, else the first largest) like the CPU's, and the losses agree.
TEST(CrossEntropyEmulated, CorrectFollowsArgmaxOnTiesNanAndInfinities) {
  const double nan = std::nan(""), inf = INFINITY;
  for (const int64_t cols : {int64_t(600), int64_t(4800)}) {
    for (DType t : kFloats) {
      SCOPED_TRACE(name_of(t, {10, cols}));
      std::vector<double> v = random({10, cols}, 35, DType::f64).to_vector<double>();
      auto at = [&](int64_t r, int64_t c) -> double& { return v[size_t(r * cols + c)]; };
      const int64_t early = 17, late = cols - 45;  // other threads, other packs
      std::vector<int64_t> targets(10);
      at(0, early) = at(0, late) = 50;  // a tie: the first wins
      targets[0] = early;
      at(1, early) = at(1, late) = 50;
      targets[1] = late;  // the tie's loser
      at(2, early) = 50;
      at(2, late) = nan;  // a NaN beats the max
      targets[2] = late;
      at(3, early) = nan;
      at(3, late) = nan;
      targets[3] = late;  // the second NaN loses
      at(4, early) = inf;
      targets[4] = early;
      at(5, late) = -inf;  // finite row otherwise: -inf is no obstacle
      at(5, early) = 60;
      targets[5] = early;
      for (int64_t c = 0; c < cols; ++c) at(6, c) = -inf;
      targets[6] = 0;  // all -inf: column 0
      at(7, late) = 70;
      targets[7] = late;
      at(8, late) = 70;
      targets[8] = -100;  // a hit, ignored
      targets[9] = 3;
      const Tensor logits = Tensor::from_vector(v, {10, cols}).to(t);
      const Tensor tt = Tensor::from_vector(targets, {10});
      const Tensor grad_loss = Tensor::full({}, 1.0, t == DType::f64 ? DType::f64 : DType::f32);
      const CrossEntropyOut ref = cross_entropy_on(false, logits, tt, -100, grad_loss);
      const CrossEntropyOut got = cross_entropy_on(true, logits, tt, -100, grad_loss);
      // Hits: rows 0, 2, 4, 5, 6 and 7.
      EXPECT_EQ(ref.correct.item(), 6.0);
      expect_equal(got.correct, ref.correct, "correct");
      expect_equal(got.count, ref.count, "count");
      const std::vector<double> lg = got.lse.to_vector<double>(), lr = ref.lse.to_vector<double>();
      for (size_t r = 0; r < lr.size(); ++r) {
        // The broken rows' lse is not finite on either side; the others agree.
        EXPECT_EQ(std::isfinite(lg[r]), std::isfinite(lr[r])) << "row " << r;
        if (std::isfinite(lr[r])) {
          EXPECT_NEAR(lg[r], lr[r], 1e-4 * std::fabs(lr[r])) << "row " << r;
        }
      }
    }
  }
}

// A target out of range: the row counts for nothing, its gradient is zero,
// and the first bad row is reported (position and id) at the op's site.
TEST(CrossEntropyEmulated, BadTargetsAreReportedLikeTheCpu) {
  const int64_t rows = 70, cols = 20;
  const Tensor logits = random({rows, cols}, 32, DType::f32);
  std::vector<int64_t> targets(static_cast<size_t>(rows), 3);
  targets[50] = cols;  // the first bad one
  targets[60] = -5;
  targets[10] = -1;  // ignored
  const Tensor tt = Tensor::from_vector(targets, {rows});
  const Tensor grad_loss = Tensor::full({}, 1.0);
  const CrossEntropyOut ref = cross_entropy_on(false, logits, tt, -1, grad_loss);
  const CrossEntropyOut got = cross_entropy_on(true, logits, tt, -1, grad_loss);
  expect_equal(got.count, ref.count, "count");
  expect_close(got.loss, ref.loss, 1e-5, "loss");
  expect_close(got.grad, ref.grad, 1e-5, "grad");
  ASSERT_EQ(ref.error.raised, 1);
  EXPECT_EQ(got.error.raised, 1);
  EXPECT_EQ(got.error.site, ref.error.site);
  EXPECT_EQ(got.error.position, ref.error.position);
  EXPECT_EQ(got.error.value, ref.error.value);
}

}  // namespace
}  // namespace roformer
