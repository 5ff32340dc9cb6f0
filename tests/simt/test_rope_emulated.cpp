// The rotary position embedding kernels' own source (core/cuda/kernels/
// rope.cu) run through the SIMT emulator against the CPU kernels: the cos/sin
// table of strided positions, and the rotation (interleaved or halves,
// forward or inverse) of contiguous and transposed x. No GPU needed.
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

TEST(RopeEmulated, TableAndRotationMatchTheCpu) {
  const int64_t S = 40, D = 16;
  std::vector<int64_t> p(2 * S);
  for (size_t i = 0; i < p.size(); ++i) p[i] = int64_t(i * 3 % 97);
  for (DType it : {DType::i64, DType::i32}) {
    // Every other position: a strided positions vector.
    const Tensor positions = Tensor::from_vector(p, {S, 2}).to(it).select(1, 1);
    for (DType t : {DType::f32, DType::bf16, DType::f64}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " positions " + dtype_name(it));
      const DType table_dtype = t == DType::f64 ? DType::f64 : DType::f32;
      const Tensor table = table_on(false, positions, D, table_dtype);
      expect_close(table_on(true, positions, D, table_dtype), table,
                   table_dtype == DType::f32 ? 1e-7 : 1e-15, "table");
      for (bool transposed : {false, true}) {
        // x [2, 3, S, D], or the same shape over [2, S, 3, D] memory.
        const Tensor x =
            transposed ? random({2, S, 3, D}, 1, t).transpose(1, 2) : random({2, 3, S, D}, 1, t);
        for (bool interleaved : {false, true}) {
          for (bool inverse : {false, true}) {
            SCOPED_TRACE(std::string(transposed ? "transposed" : "contiguous") +
                         (interleaved ? " interleaved" : " halves") + (inverse ? " inverse" : ""));
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

}  // namespace
}  // namespace roformer
