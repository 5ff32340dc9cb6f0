// The rotary position embedding kernels' own source (core/cuda/kernels/
// rope.cu) run through the SIMT emulator against the CPU kernels: the cos/sin
// table of strided positions, and the rotation (interleaved or halves,
// forward or inverse) of x in layouts that take the packed kernel and layouts
// that take the per-pair one. No GPU needed.
#include <gtest/gtest.h>

#include "tests/simt/emulated_test_support.h"

namespace roformer {
namespace {

using namespace testing::emulated;
namespace cpu = kernels::cpu;
namespace emu = kernels::simt_cuda;

Tensor table_on(bool emulated, const Tensor& positions, int64_t D, DType t) {
  const Tensor table = poisoned({2, positions.numel(), D / 2}, t);
  EmulatedStream s;
  if (emulated)
    emu::rope_table(s.get(), kernel_tensor(positions), 10000.0, kernel_tensor(table));
  else
    cpu::rope_table(cpu_stream(), kernel_tensor(positions), 10000.0, kernel_tensor(table));
  return table;
}

// x [2, 3, S, D] in five memory layouts: contiguous; over [2, S, 3, D]
// memory (the model's heads of a [B, S, H * D] projection); rows two elements
// apart from their neighbours' ends (no Pack8 row starts); rows a multiple
// of 8 apart but starting one element past a 16-byte boundary; the last dim
// strided. The first two take the packed kernel where D allows it (a
// multiple of 8 interleaved, of 16 for halves), the others the per-pair one
// (a packed read off its boundary would be UBSan's in the sanitized build).
Tensor rope_input(const std::string& layout, int64_t S, int64_t D, DType t) {
  if (layout == "transposed") return random({2, S, 3, D}, 1, t).transpose(1, 2);
  if (layout == "padded rows") return random({2, 3, S, D + 2}, 1, t).narrow(3, 0, D);
  if (layout == "offset rows") return random({2, 3, S, D + 8}, 1, t).narrow(3, 1, D);
  if (layout == "strided last dim") return random({2, 3, S, D, 2}, 1, t).select(4, 1);
  return random({2, 3, S, D}, 1, t);
}

TEST(RopeEmulated, TableAndRotationMatchTheCpu) {
  const int64_t S = 40;
  std::vector<int64_t> p(2 * S);
  for (size_t i = 0; i < p.size(); ++i) p[i] = int64_t(i * 3 % 97);
  for (DType it : {DType::i64, DType::i32}) {
    // Every other position: a strided positions vector.
    const Tensor positions = Tensor::from_vector(p, {S, 2}).to(it).select(1, 1);
    for (DType t : {DType::f32, DType::bf16, DType::f64}) {
      // 16: packs for both layouts; 24: interleaved only; 12: neither.
      for (const int64_t D : {16, 24, 12}) {
        SCOPED_TRACE(std::string(dtype_name(t)) + " positions " + dtype_name(it) + " D " +
                     std::to_string(D));
        const DType table_dtype = t == DType::f64 ? DType::f64 : DType::f32;
        const Tensor table = table_on(false, positions, D, table_dtype);
        expect_close(table_on(true, positions, D, table_dtype), table,
                     table_dtype == DType::f32 ? 1e-7 : 1e-15, "table");
        for (const std::string layout :
             {"contiguous", "transposed", "padded rows", "offset rows", "strided last dim"}) {
          const Tensor x = rope_input(layout, S, D, t);
          for (bool interleaved : {false, true}) {
            for (bool inverse : {false, true}) {
              SCOPED_TRACE(layout + (interleaved ? " interleaved" : " halves") +
                           (inverse ? " inverse" : ""));
              const Tensor ref = poisoned(x.shape(), t), got = poisoned(x.shape(), t);
              cpu::rope(cpu_stream(), kernel_tensor(x.contiguous()), kernel_tensor(table),
                        interleaved, inverse, kernel_tensor(ref));
              EmulatedStream s;
              emu::rope(s.get(), kernel_tensor(x), kernel_tensor(table), interleaved, inverse,
                        kernel_tensor(got));
              expect_close(got, ref, tolerance(t), "rope");
            }
          }
        }
      }
    }
  }
}

// Outputs that are views (the rotate-once backward writes dq and dk into
// qkv's gradient): the same rows rotated into a transposed out (packed
// kernel where D allows) and into rows 8 apart starting one element off a
// 16-byte boundary (per-pair kernel), on both devices, and nothing written
// outside the view (its memory's other elements stay poisoned).
TEST(RopeEmulated, StridedOutputsTakeTheRotationAndNothingElse) {
  const int64_t S = 24;
  std::vector<int64_t> p(S);
  for (int64_t i = 0; i < S; ++i) p[size_t(i)] = (i * 5) % 31;
  const Tensor positions = Tensor::from_vector(p, {S});
  for (DType t : {DType::f32, DType::bf16, DType::f64}) {
    for (const int64_t D : {16, 24}) {
      const Tensor table = table_on(false, positions, D, t == DType::f64 ? DType::f64 : DType::f32);
      for (const std::string in_layout : {"contiguous", "transposed"}) {
        const Tensor x = rope_input(in_layout, S, D, t);
        for (bool interleaved : {false, true}) {
          SCOPED_TRACE(std::string(dtype_name(t)) + " D " + std::to_string(D) + " " + in_layout +
                       (interleaved ? " interleaved" : " halves"));
          const Tensor ref = poisoned(x.shape(), t);
          cpu::rope(cpu_stream(), kernel_tensor(x), kernel_tensor(table), interleaved, true,
                    kernel_tensor(ref));
          for (const std::string out_layout : {"transposed out", "offset out rows"}) {
            SCOPED_TRACE(out_layout);
            for (const bool emulated : {false, true}) {
              const bool transposed = out_layout == "transposed out";
              const Tensor memory =
                  poisoned(transposed ? Shape{2, S, 3, D} : Shape{2, 3, S, D + 8}, t);
              const Tensor out = transposed ? memory.transpose(1, 2) : memory.narrow(3, 1, D);
              EmulatedStream s;
              if (emulated)
                emu::rope(s.get(), kernel_tensor(x), kernel_tensor(table), interleaved, true,
                          kernel_tensor(out));
              else
                cpu::rope(cpu_stream(), kernel_tensor(x), kernel_tensor(table), interleaved, true,
                          kernel_tensor(out));
              expect_close(out.contiguous(), ref, tolerance(t), emulated ? "emulated" : "cpu");
              if (!transposed) {  // the two columns around each row untouched
                for (const Tensor& edge : {memory.narrow(3, 0, 1), memory.narrow(3, D + 1, 7)})
                  for (double v : edge.to(DType::f64).to_vector<double>())
                    ASSERT_TRUE(std::isnan(v));
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace roformer
