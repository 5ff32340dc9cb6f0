// The row gather and its deterministic scatter-add (core/cuda/kernels/
// gather.cu) run through the SIMT emulator against the CPU kernels. CUB's
// radix sort cannot run there: kernel_emulation.h puts a host stable sort of
// the same (key, position) pairs in its place, the kernels around it are the
// file's own. Segments of one id longer than the 256-row chunk, one ending
// exactly at a chunk's end, and bad ids. No GPU needed.
#include <gtest/gtest.h>

#include "tests/simt/emulated_test_support.h"

namespace roformer {
namespace {

using namespace testing::emulated;
namespace cpu = kernels::cpu;
namespace emu = kernels::simt_cuda;

// Rows of 36 elements move in 16-byte words (8 for bf16), rows of 35 in 8,
// 4 or 2 (bf16): every width gather_rows_kernel has.
TEST(GatherEmulated, GatherRowsMatchesAndReportsTheFirstBadId) {
  const int64_t rows = 50;
  std::vector<int64_t> ids(3 * 70);
  for (size_t n = 0; n < ids.size(); ++n) ids[n] = int64_t(n * 17 % rows);
  ids[100] = rows;  // the first bad one
  ids[150] = -1;
  for (const int64_t width : {int64_t(36), int64_t(35)}) {
    for (DType t : {DType::f32, DType::bf16, DType::f64, DType::i64, DType::i32}) {
      for (DType it : {DType::i64, DType::i32}) {
        SCOPED_TRACE(std::to_string(width) + " " + dtype_name(t) + " ids " + dtype_name(it));
        const Tensor table = random({rows, width}, 1, t, 10.0);
        const Tensor id = Tensor::from_vector(ids, {3, 70}).to(it);
        const Tensor ref = poisoned({3, 70, width}, t), got = poisoned({3, 70, width}, t);
        const int32_t site = 7;
        const kernels::Stream cs = cpu_stream();
        cpu::gather_rows(cs, kernel_tensor(table), kernel_tensor(id), site, kernel_tensor(ref));
        KernelError ref_error;
        cpu::take_error(cs, &ref_error);
        EmulatedStream s;
        emu::gather_rows(s.get(), kernel_tensor(table), kernel_tensor(id), site,
                         kernel_tensor(got));
        expect_equal(got, ref, "rows");
        ASSERT_EQ(ref_error.raised, 1);
        EXPECT_EQ(s.record.raised, 1);
        EXPECT_EQ(s.record.site, ref_error.site);
        EXPECT_EQ(s.record.position, ref_error.position);
        EXPECT_EQ(s.record.value, ref_error.value);
      }
    }
  }
}

void expect_scatter_matches(const std::vector<int64_t>& ids, int64_t rows, int64_t dim, DType t,
                            const std::string& what) {
  for (DType it : {DType::i64, DType::i32}) {
    SCOPED_TRACE(what + " " + dtype_name(t) + " ids " + dtype_name(it));
    const int64_t count = int64_t(ids.size());
    const Tensor grad = random({count, dim}, 2, t);
    const Tensor id = Tensor::from_vector(ids, {count}).to(it);
    const Tensor ref = Tensor::zeros({rows, dim}, t), got = Tensor::zeros({rows, dim}, t);
    cpu::scatter_add_rows(cpu_stream(), kernel_tensor(grad), kernel_tensor(id), kernel_tensor(ref));
    EmulatedStream s;
    emu::scatter_add_rows(s.get(), kernel_tensor(grad), kernel_tensor(id), kernel_tensor(got));
    // Both add each id's rows in position order, in acc_t.
    expect_close(got, ref, t == DType::f64 ? 1e-14 : t == DType::f32 ? 1e-6 : 1e-2, "grad_table");
  }
}

TEST(GatherEmulated, ScatterAddRowsOverLongSegments) {
  for (DType t : {DType::f32, DType::bf16, DType::f64}) {
    // Two ids (a token-type table): id 1's segment spans four 256-row chunks.
    std::vector<int64_t> two(1100);
    for (size_t n = 0; n < two.size(); ++n) two[n] = n % 5 == 0 ? 0 : 1;
    expect_scatter_matches(two, 2, 40, t, "two ids");
    // Sorted: id 0's 512 rows fill chunks 0 and 1 exactly (a segment ending
    // at a chunk's end), id 2's 100, id 3's 256 (into chunk 3), then the bad
    // ids (skipped); in a scrambled position order.
    std::vector<int64_t> exact;
    for (int i = 0; i < 256; ++i) exact.push_back(3);
    for (int i = 0; i < 512; ++i) exact.push_back(0);
    for (int i = 0; i < 100; ++i) exact.push_back(2);
    for (int i = 0; i < 30; ++i) exact.push_back(i % 2 ? 4 : -2);  // rows = 4: 4 is bad
    std::vector<int64_t> scrambled(exact.size());
    for (size_t n = 0; n < exact.size(); ++n) scrambled[n * 7 % exact.size()] = exact[n];
    expect_scatter_matches(scrambled, 4, 40, t, "chunk-aligned segments");
  }
  // Many short segments across column blocks.
  std::vector<int64_t> many(300);
  for (size_t n = 0; n < many.size(); ++n) many[n] = int64_t(n * 13 % 97);
  expect_scatter_matches(many, 100, 300, DType::f32, "many ids");
}

}  // namespace
}  // namespace roformer
