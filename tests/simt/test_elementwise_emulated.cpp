// The elementwise and copy kernels' own source (core/cuda/kernels/
// elementwise.cu, copy.cu) run through the SIMT emulator against the CPU
// kernels: binary, unary, where and GELU over the Strided geometry after
// coalescing (core/kernels/coalesce_dims.h) with contiguous, broadcast,
// transposed and sliced operands and a transposed result; dropout, copies
// (casts, views, overlapping ones), fill and the Philox random fill. No GPU
// needed.
#include <gtest/gtest.h>

#include <functional>
#include <utility>

#include "tests/simt/emulated_test_support.h"

namespace roformer {
namespace {

using namespace testing::emulated;
namespace cpu = kernels::cpu;
namespace emu = kernels::simt_cuda;

// The result's shape: 2100 elements, 9 blocks of 256 threads.
const Shape kShape = {6, 50, 7};

// Operands laid out as `layout` names, each with kShape's values.
Tensor operand(const std::string& layout, uint64_t seed, DType t, double scale = 1.0,
               double shift = 0.0) {
  if (layout == "contiguous") return random(kShape, seed, t, scale, shift);
  if (layout == "broadcast") return random({1, 50, 1}, seed, t, scale, shift).expand(kShape);
  if (layout == "scalar") return random({1, 1, 1}, seed, t, scale, shift).expand(kShape);
  if (layout == "transposed") return random({7, 50, 6}, seed, t, scale, shift).permute({2, 1, 0});
  return random({6, 60, 7}, seed, t, scale, shift).narrow(1, 5, 50);  // sliced
}
const char* const kLayouts[] = {"contiguous", "broadcast", "scalar", "transposed", "sliced"};

// A poisoned result, contiguous or a transposed view.
Tensor result(bool transposed, DType t) {
  return transposed ? poisoned({7, 50, 6}, t).permute({2, 1, 0}) : poisoned(kShape, t);
}

double tol_of(DType t) {
  return is_floating(t) ? tolerance(t) : 0.0;
}

void expect_same(const Tensor& got, const Tensor& ref, DType t, const std::string& what) {
  if (is_floating(t))
    expect_close(got, ref, tol_of(t), what);
  else
    expect_equal(got, ref, what);
}

TEST(ElementwiseEmulated, BinaryOverEveryLayout) {
  for (DType t : {DType::f32, DType::bf16, DType::f64, DType::i64, DType::i32}) {
    for (const char* la : kLayouts) {
      for (const char* lb : {"contiguous", "broadcast", "transposed"}) {
        for (bool out_t : {false, true}) {
          SCOPED_TRACE(std::string(dtype_name(t)) + " a " + la + ", b " + lb +
                       (out_t ? ", transposed result" : ""));
          // b > 0: integer division by zero is undefined on both devices.
          const Tensor a = operand(la, 1, t, 10.0), b = operand(lb, 2, t, 1.0, 12.0);
          for (auto op : {kernels::BinaryOp::add, kernels::BinaryOp::sub, kernels::BinaryOp::mul,
                          kernels::BinaryOp::div}) {
            const Tensor ref = result(out_t, t), got = result(out_t, t);
            cpu::binary(cpu_stream(), op, kernel_tensor(a), kernel_tensor(b), kernel_tensor(ref));
            EmulatedStream s;
            emu::binary(s.get(), op, kernel_tensor(a), kernel_tensor(b), kernel_tensor(got));
            expect_same(got, ref, t, "op " + std::to_string(int(op)));
          }
        }
      }
    }
  }
}

TEST(ElementwiseEmulated, UnaryOverEveryLayout) {
  using kernels::UnaryOp;
  const UnaryOp all[] = {UnaryOp::neg,         UnaryOp::exp,          UnaryOp::log,
                         UnaryOp::sqrt,        UnaryOp::rsqrt,        UnaryOp::tanh,
                         UnaryOp::pow,         UnaryOp::add_scalar,   UnaryOp::mul_scalar,
                         UnaryOp::rsub_scalar, UnaryOp::elu_plus_one, UnaryOp::elu_plus_one_grad};
  for (DType t : {DType::f32, DType::bf16, DType::f64, DType::i64}) {
    for (const char* la : kLayouts) {
      for (bool out_t : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(t)) + " a " + la + (out_t ? ", transposed" : ""));
        for (UnaryOp op : all) {
          const bool positive = op == UnaryOp::log || op == UnaryOp::sqrt || op == UnaryOp::rsqrt ||
                                op == UnaryOp::pow;
          if (!is_floating(t) && op != UnaryOp::neg && op != UnaryOp::add_scalar &&
              op != UnaryOp::mul_scalar && op != UnaryOp::rsub_scalar)
            continue;
          const Tensor a = positive ? operand(la, 3, t, 1.0, 6.0) : operand(la, 3, t, 2.0);
          const Tensor ref = result(out_t, t), got = result(out_t, t);
          const double scalar = is_floating(t) ? 1.7 : 3.0;
          cpu::unary(cpu_stream(), op, kernel_tensor(a), kernel_tensor(ref), scalar);
          EmulatedStream s;
          emu::unary(s.get(), op, kernel_tensor(a), kernel_tensor(got), scalar);
          expect_same(got, ref, t, "op " + std::to_string(int(op)));
        }
      }
    }
  }
}

TEST(ElementwiseEmulated, WhereAndGeluOverLayouts) {
  for (DType t : {DType::f32, DType::bf16, DType::f64}) {
    for (const char* lc : {"contiguous", "broadcast", "transposed"}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " cond/x " + lc);
      for (DType ct : {DType::i32, DType::f32}) {
        Tensor cond = operand(lc, 4, DType::f64);
        std::vector<double> v = cond.contiguous().to_vector<double>();
        for (double& x : v) x = x > 0.3 ? 2.0 : 0.0;
        cond = Tensor::from_vector(v, cond.shape()).to(ct);
        const Tensor a = operand("transposed", 5, t), b = operand("broadcast", 6, t);
        const Tensor ref = result(false, t), got = result(true, t);
        cpu::where(cpu_stream(), kernel_tensor(cond), kernel_tensor(a), kernel_tensor(b),
                   kernel_tensor(ref));
        EmulatedStream s;
        emu::where(s.get(), kernel_tensor(cond), kernel_tensor(a), kernel_tensor(b),
                   kernel_tensor(got));
        expect_equal(got, ref, "where");
      }
      // The CPU's GELU takes contiguous operands only (the op makes them so).
      const Tensor x = operand(lc, 7, t, 2.0), dy = operand("sliced", 8, t);
      const Tensor xc = x.contiguous(), dyc = dy.contiguous();
      const Tensor ref_y = result(false, t), got_y = result(true, t);
      cpu::gelu_forward(cpu_stream(), kernel_tensor(xc), kernel_tensor(ref_y));
      EmulatedStream s;
      emu::gelu_forward(s.get(), kernel_tensor(x), kernel_tensor(got_y));
      expect_close(got_y, ref_y, tolerance(t), "gelu");
      const Tensor ref_dx = result(false, t), got_dx = result(true, t);
      cpu::gelu_backward(cpu_stream(), kernel_tensor(xc), kernel_tensor(dyc),
                         kernel_tensor(ref_dx));
      emu::gelu_backward(s.get(), kernel_tensor(x), kernel_tensor(dy), kernel_tensor(got_dx));
      expect_close(got_dx, ref_dx, tolerance(t), "gelu_backward");
    }
  }
}

// GELU over contiguous operands: packs of eight elements as 16-byte words,
// two packs a thread (2,100 = 262 packs, halves of 131, and a tail of 4
// through the strided kernel; 2,092 = 261 packs, whose last thread has no
// second pack), and the same operands one element off a 16-byte boundary
// (no packs at all).
TEST(ElementwiseEmulated, GeluOverContiguousOperandsInPacksOfEight) {
  for (DType t : {DType::f32, DType::bf16, DType::f64}) {
    for (const auto& [n, skew] : {std::pair<int64_t, int64_t>{2100, 0}, {2100, 1}, {2092, 0}}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + ", " + std::to_string(n) + " elements" +
                   (skew ? ", skewed by one element" : ""));
      const Shape shape = n == 2100 ? kShape : Shape{n};
      auto flat = [&](uint64_t seed) {
        return random({n + skew}, seed, t, 2.0).narrow(0, skew, n).reshape(shape);
      };
      const Tensor x = flat(7), dy = flat(8);
      const Tensor y = poisoned({n + skew}, t).narrow(0, skew, n).reshape(shape);
      const Tensor dx = poisoned({n + skew}, t).narrow(0, skew, n).reshape(shape);
      const Tensor ref_y = poisoned(shape, t), ref_dx = poisoned(shape, t);
      const Tensor xc = x.contiguous(), dyc = dy.contiguous();
      cpu::gelu_forward(cpu_stream(), kernel_tensor(xc), kernel_tensor(ref_y));
      cpu::gelu_backward(cpu_stream(), kernel_tensor(xc), kernel_tensor(dyc),
                         kernel_tensor(ref_dx));
      EmulatedStream s;
      emu::gelu_forward(s.get(), kernel_tensor(x), kernel_tensor(y));
      emu::gelu_backward(s.get(), kernel_tensor(x), kernel_tensor(dy), kernel_tensor(dx));
      expect_close(y, ref_y, tolerance(t), "gelu");
      expect_close(dx, ref_dx, tolerance(t), "gelu_backward");
    }
  }
}

// Dropout: the CPU's mask bit for bit (the shared Philox rule), the kept
// values scaled as there.
TEST(ElementwiseEmulated, DropoutKeepsTheCpusElements) {
  const DropoutKey key{17, 3, 5, 2};
  for (DType t : {DType::f32, DType::bf16, DType::f64}) {
    SCOPED_TRACE(dtype_name(t));
    // A thread per group of eight features: 29 leaves a tail of five.
    const Tensor x = random({3, 40, 29}, 9, t, 1.0, 3.0);
    const Tensor ref = poisoned(x.shape(), t), got = poisoned(x.shape(), t);
    cpu::dropout(cpu_stream(), kernel_tensor(x), kernel_tensor(ref), 0.25, key);
    EmulatedStream s;
    emu::dropout(s.get(), kernel_tensor(x), kernel_tensor(got), 0.25, key);
    const std::vector<double> a = testing::host(got), b = testing::host(ref);
    int64_t dropped = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i] == 0.0, b[i] == 0.0) << "element " << i;
      dropped += b[i] == 0.0;
    }
    EXPECT_GT(dropped, int64_t(a.size()) / 8);
    expect_close(got, ref, t == DType::f64 ? 1e-15 : 1e-6, "kept values");
  }
}

// --- copy.cu ------------------------------------------------------------------------
void expect_copy_matches(const Tensor& src, const Tensor& ref_dst, const Tensor& got_dst,
                         const std::string& what) {
  SCOPED_TRACE(what);
  cpu::copy(cpu_stream(), kernel_tensor(src), kernel_tensor(ref_dst));
  EmulatedStream s;
  emu::copy(s.get(), kernel_tensor(src), kernel_tensor(got_dst));
  expect_equal(got_dst, ref_dst, "copy");
}

TEST(CopyEmulated, CastsAndViews) {
  const DType all[] = {DType::f32, DType::bf16, DType::f64, DType::i32, DType::i64};
  for (DType from : all) {
    for (DType to : all) {
      const std::string what = std::string(dtype_name(from)) + " to " + dtype_name(to);
      const Tensor src = operand("transposed", 10, from, 50.0);
      expect_copy_matches(src, result(false, to), result(false, to), what + ", transposed src");
      expect_copy_matches(operand("contiguous", 11, from, 50.0), result(true, to), result(true, to),
                          what + ", transposed dst");
    }
  }
  // Same dtype, both contiguous: the cudaMemcpyAsync path.
  const Tensor src = operand("contiguous", 12, DType::f32);
  expect_copy_matches(src, result(false, DType::f32), result(false, DType::f32), "plain");
  expect_copy_matches(operand("broadcast", 13, DType::bf16), result(false, DType::bf16),
                      result(false, DType::bf16), "broadcast src");
}

// Copies between views of one buffer go through a temporary: a transpose in
// place, and a shift by one element (plain, where cudaMemcpy is no memmove).
TEST(CopyEmulated, OverlappingViews) {
  auto run = [](bool emulated, const std::function<std::pair<Tensor, Tensor>(const Tensor&)>& views,
                const Tensor& buffer) {
    const Tensor b = buffer.clone();
    const auto [src, dst] = views(b);
    EmulatedStream s;
    if (emulated)
      emu::copy(s.get(), kernel_tensor(src), kernel_tensor(dst));
    else
      cpu::copy(cpu_stream(), kernel_tensor(src), kernel_tensor(dst));
    return b;
  };
  const Tensor square = random({40, 40}, 14, DType::f32);
  auto transpose = [](const Tensor& b) { return std::make_pair(b.transpose(0, 1), b); };
  expect_equal(run(true, transpose, square), run(false, transpose, square), "in-place transpose");
  const Tensor line = random({1000}, 15, DType::f32);
  auto shift = [](const Tensor& b) {
    return std::make_pair(b.narrow(0, 0, 999), b.narrow(0, 1, 999));
  };
  expect_equal(run(true, shift, line), run(false, shift, line), "shift by one");
  auto shift_back = [](const Tensor& b) {
    return std::make_pair(b.narrow(0, 1, 999), b.narrow(0, 0, 999));
  };
  expect_equal(run(true, shift_back, line), run(false, shift_back, line), "shift back");
}

TEST(CopyEmulated, FillAndRandomFill) {
  for (DType t : {DType::f32, DType::bf16, DType::f64, DType::i32, DType::i64}) {
    SCOPED_TRACE(dtype_name(t));
    const Tensor ref = result(true, t), got = result(true, t);
    const Tensor ref_part = ref.narrow(1, 3, 40), got_part = got.narrow(1, 3, 40);
    cpu::fill(cpu_stream(), kernel_tensor(ref_part), 2.7);
    EmulatedStream s;
    emu::fill(s.get(), kernel_tensor(got_part), 2.7);
    expect_equal(got, ref, "fill of a slice");  // the rest stays poisoned on both
  }
  for (DType t : {DType::f32, DType::bf16, DType::f64}) {
    for (bool normal : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + (normal ? " normal" : " uniform"));
      // Offsets come from Generator::take, multiples of 4 (the CPU's normal
      // draw needs that); a uniform one may start anywhere.
      const uint64_t offset = normal ? 12344 : 12345;
      const Tensor ref = poisoned({3000}, t), got = poisoned({3000}, t);
      cpu::random_fill(cpu_stream(), kernel_tensor(ref), 99, offset, normal);
      EmulatedStream s;
      emu::random_fill(s.get(), kernel_tensor(got), 99, offset, normal);
      expect_close(got, ref, t == DType::f64 ? 1e-15 : 1e-7, "random_fill");
    }
  }
}

}  // namespace
}  // namespace roformer
