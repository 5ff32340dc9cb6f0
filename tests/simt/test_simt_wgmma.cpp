// The SIMT emulator's Hopper warpgroup products (simt.h: wgmma): m64n64k16
// from 128-byte-swizzled shared tiles (A and B K-major, B N-major by
// trans-b, A from registers) against a plain matrix product on random data,
// issued directly and through the flash kernels' wrappers (wgmma_probe.cu);
// results landing only at the wait; and the faults it reports.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "tests/cuda/wgmma_probe.h"
#include "tests/cuda/wgmma_probe_cases.h"
#include "tests/simt/bf16_bits.h"
#include "tests/simt/simt.h"

namespace roformer {
namespace {

using simt::launch;

using testing::bf16_value;
using testing::random_bf16;

// A 64 x 64 bf16 tile in the 128-byte swizzle: element (r, c) of the
// row-major matrix at element r * 64 + 8 ((c / 8) ^ (r % 8)) + c % 8.
int swizzled(int r, int c) {
  return r * 64 + 8 * ((c / 8) ^ (r % 8)) + c % 8;
}

// The PTX ISA's descriptor fields: start address, leading and stride byte
// offsets (16-byte units), base offset, swizzle mode 1 (128 bytes).
uint64_t descriptor(const void* shared, uint32_t byte_offset, uint32_t base_offset = 0) {
  const uint32_t address = uint32_t(__cvta_generic_to_shared(shared)) + byte_offset;
  return uint64_t(address >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(base_offset) << 49) | (uint64_t(1) << 62);
}

struct WgmmaArgs {
  const uint16_t* a;  // [64][64] row-major (M x K)
  const uint16_t* b;  // [64][64] row-major (K x N)
  const float* c;     // [64][64]
  float* ss;          // A B: A and B^T K-major tiles in shared memory
  float* rs;          // C + A B: A from registers, B N-major (trans-b)
  float* before;      // the rs accumulator read before the wait (C)
};

// D element of accumulator register i of thread T: rows 16 (T / 32) +
// (T % 32) / 4 (+ 8), columns 8 (i / 4) + 2 (T % 4) + (i & 1).
int d_index(int T, int i) {
  const int lane = T % 32, row = 16 * (T / 32) + lane / 4 + 8 * ((i >> 1) & 1);
  return row * 64 + 8 * (i >> 2) + 2 * (lane % 4) + (i & 1);
}

// One warpgroup: A, B^T and B in swizzled tiles on a 1024-byte boundary of
// the dynamic shared memory.
__global__ void wgmma_kernel(WgmmaArgs args) {
  RF_DYNAMIC_SHARED(smem);
  const uint32_t misalign = uint32_t(__cvta_generic_to_shared(smem)) % 1024u;
  uint16_t* sA = reinterpret_cast<uint16_t*>(smem + (1024u - misalign) % 1024u);
  uint16_t* sBt = sA + 64 * 64;  // [N][K]: B^T, read K-major
  uint16_t* sB = sBt + 64 * 64;  // [K][N]: read N-major
  const int T = threadIdx.x, lane = T % 32, g = lane / 4, t = lane % 4;
  for (int e = T; e < 64 * 64; e += 128) {
    const int r = e / 64, col = e % 64;
    sA[swizzled(r, col)] = args.a[e];
    sBt[swizzled(col, r)] = args.b[e];
    sB[swizzled(r, col)] = args.b[e];
  }
  __syncthreads();
  float ss[32], rs[32];
  for (int i = 0; i < 32; ++i) rs[i] = args.c[d_index(T, i)];
  for (int ks = 0; ks < 4; ++ks)
    simt::wgmma_m64n64k16_ss(ss, descriptor(sA, 32u * uint32_t(ks)),
                             descriptor(sBt, 32u * uint32_t(ks)), ks > 0, false, false);
  for (int ks = 0; ks < 4; ++ks) {
    // This thread's A fragment of k step ks, in mma.sync's A layout per warp.
    uint32_t a[4];
    for (int j = 0; j < 4; ++j) {
      const int row = 16 * (T / 32) + g + 8 * (j & 1), k = 16 * ks + 2 * t + 8 * (j >> 1);
      a[j] = uint32_t(args.a[row * 64 + k]) | (uint32_t(args.a[row * 64 + k + 1]) << 16);
    }
    simt::wgmma_m64n64k16_rs(rs, a, descriptor(sB, 2048u * uint32_t(ks)), true, true);
  }
  simt::wgmma_commit();
  for (int i = 0; i < 32; ++i) args.before[d_index(T, i)] = rs[i];
  simt::wgmma_wait(0);
  for (int i = 0; i < 32; ++i) {
    args.ss[d_index(T, i)] = ss[i];
    args.rs[d_index(T, i)] = rs[i];
  }
}

constexpr size_t kWgmmaShared = 1024 + 3 * 64 * 64 * sizeof(uint16_t);

TEST(SimtWgmma, ProductsOfSwizzledTilesAreTheMatrixProduct) {
  for (uint32_t seed = 1; seed <= 2; ++seed) {
    const std::vector<uint16_t> a = random_bf16(64 * 64, seed), b = random_bf16(64 * 64, seed + 10);
    std::vector<float> c(64 * 64);
    for (size_t i = 0; i < c.size(); ++i) c[i] = bf16_value(a[(i * 7) % a.size()]) + 0.5f;
    std::vector<float> ss(64 * 64, NAN), rs(64 * 64, NAN), before(64 * 64, NAN);
    simt::allow_dynamic_shared(wgmma_kernel, kWgmmaShared);
    launch(wgmma_kernel, dim3(1), dim3(128), kWgmmaShared,
           WgmmaArgs{a.data(), b.data(), c.data(), ss.data(), rs.data(), before.data()});
    for (int i = 0; i < 64; ++i)
      for (int j = 0; j < 64; ++j) {
        double ref = 0.0;
        for (int k = 0; k < 64; ++k)
          ref += double(bf16_value(a[size_t(i * 64 + k)])) * bf16_value(b[size_t(k * 64 + j)]);
        const size_t at = size_t(i * 64 + j);
        ASSERT_NEAR(ss[at], ref, 1e-5 * (1 + std::abs(ref))) << i << "," << j;
        ASSERT_NEAR(rs[at], c[at] + ref, 1e-5 * (1 + std::abs(ref))) << i << "," << j;
        ASSERT_EQ(before[at], c[at]) << "the accumulator changed before the wait";
      }
  }
}

// The flash kernels' own wrappers and descriptors (core/cuda/kernels/wgmma.cuh,
// through tests/cuda/wgmma_probe.cu), the same check a GPU runs
// (tests/cuda/test_cuda_wgmma.cpp).
TEST(SimtWgmma, TheKernelsWrappersGiveTheMatrixProducts) {
  testing::expect_wgmma_products_are_matrix_products([](const std::vector<uint16_t>& a,
                                                        const std::vector<uint16_t>& b,
                                                        const std::vector<float>& c) {
    const std::vector<float> nan(c.size(), NAN);
    testing::WgmmaProducts r{nan, nan, nan};
    testing::wgmma_products(a.data(), b.data(), c.data(), r.ss.data(), r.rs.data(), r.ts.data());
    return r;
  });
}

// Faults: threads of a warpgroup with different descriptors; a base offset;
// a thread exiting with a product in flight; shared memory written while a
// product that read it is in flight.
enum class Fault { differing, base_offset, no_wait, early_write };

__global__ void faulty_wgmma_kernel(Fault fault) {
  RF_DYNAMIC_SHARED(smem);
  const uint32_t misalign = uint32_t(__cvta_generic_to_shared(smem)) % 1024u;
  uint16_t* tile = reinterpret_cast<uint16_t*>(smem + (1024u - misalign) % 1024u);
  for (int e = threadIdx.x; e < 64 * 64; e += 128) tile[e] = 0;
  __syncthreads();
  float d[32];
  const uint32_t offset = fault == Fault::differing && threadIdx.x == 5 ? 32u : 0u;
  simt::wgmma_m64n64k16_ss(d, descriptor(tile, offset, fault == Fault::base_offset ? 1u : 0u),
                           descriptor(tile, 0), false, false, false);
  simt::wgmma_commit();
  if (fault == Fault::no_wait) return;
  if (fault == Fault::early_write && threadIdx.x == 0) tile[0] = 1;
  simt::wgmma_wait(0);
}

TEST(SimtWgmma, ReportsItsFaults) {
  const std::pair<Fault, const char*> expected[] = {{Fault::differing, "differ"},
                                                    {Fault::base_offset, "base offset"},
                                                    {Fault::no_wait, "no wgmma.wait_group"},
                                                    {Fault::early_write, "in flight"}};
  simt::allow_dynamic_shared(faulty_wgmma_kernel, 1024 + 64 * 64 * sizeof(uint16_t));
  for (const auto& [fault, what] : expected) {
    try {
      launch(faulty_wgmma_kernel, dim3(1), dim3(128), 1024 + 64 * 64 * sizeof(uint16_t), fault);
      ADD_FAILURE() << "fault " << int(fault) << " was not reported";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace roformer
