// The SIMT emulator (simt.h) on its own: the emulated ldmatrix and mma.sync
// against a plain matrix product and transpose on random data, shuffles,
// barriers, shared memory, and the faults it reports.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/error.h"
#include "tests/simt/bf16_bits.h"
#include "tests/simt/simt.h"

namespace roformer {
namespace {

using simt::launch;

using testing::bf16_bits;
using testing::bf16_value;
using testing::random_bf16;

// --- mma.sync with operands loaded by ldmatrix ---------------------------------------

struct MmaArgs {
  const uint16_t* a;   // [16][16] row-major (M x K)
  const uint16_t* b;   // [16][16] row-major (K x N), two 8-wide n tiles
  const uint16_t* bt;  // [16][16] row-major (N x K): b transposed
  const float* c;      // [16][16]
  float* d_trans;      // [16][16]: A B + C with B read by ldmatrix.trans from b
  float* d_rows;       // [16][16]: A B + C with B read by ldmatrix from bt
};

// One warp: A fragments by ldmatrix.x4, B fragments both ways, C and D in
// the accumulator layout.
__global__ void mma_kernel(MmaArgs args) {
  __shared__ __align__(16) uint16_t sA[16 * 16];
  __shared__ __align__(16) uint16_t sB[16 * 16];
  __shared__ __align__(16) uint16_t sBt[16 * 16];
  const int lane = threadIdx.x, g = lane >> 2, t = lane & 3, m = lane >> 3, r = lane & 7;
  for (int i = lane; i < 256; i += 32) {
    sA[i] = args.a[i];
    sB[i] = args.b[i];
    sBt[i] = args.bt[i];
  }
  __syncthreads();
  uint32_t a[4], b[4], bt[4];
  // A's four 8x8 matrices in register order: (rows 0-7, k 0-7), (8-15, 0-7),
  // (0-7, 8-15), (8-15, 8-15).
  simt::ldmatrix_x4(
      a, uint32_t(__cvta_generic_to_shared(&sA[(r + 8 * (m & 1)) * 16 + 8 * (m >> 1)])), false);
  // B[k][n] read transposed: matrices (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), ...
  simt::ldmatrix_x4(
      b, uint32_t(__cvta_generic_to_shared(&sB[(r + 8 * (m & 1)) * 16 + 8 * (m >> 1)])), true);
  // B^T[n][k] read as it is: matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), ...
  simt::ldmatrix_x4(
      bt, uint32_t(__cvta_generic_to_shared(&sBt[(r + 8 * (m >> 1)) * 16 + 8 * (m & 1)])), false);
  for (int nt = 0; nt < 2; ++nt) {
    float c[4], d[4], e[4];
    for (int i = 0; i < 4; ++i) c[i] = args.c[(g + 8 * (i >> 1)) * 16 + nt * 8 + 2 * t + (i & 1)];
    const uint32_t b_pair[2] = {b[2 * nt], b[2 * nt + 1]};
    const uint32_t bt_pair[2] = {bt[2 * nt], bt[2 * nt + 1]};
    simt::mma_m16n8k16_bf16(d, a, b_pair, c);
    simt::mma_m16n8k16_bf16(e, a, bt_pair, c);
    for (int i = 0; i < 4; ++i) {
      const int at = (g + 8 * (i >> 1)) * 16 + nt * 8 + 2 * t + (i & 1);
      args.d_trans[at] = d[i];
      args.d_rows[at] = e[i];
    }
  }
}

TEST(Simt, MmaOfLdmatrixFragmentsIsTheMatrixProduct) {
  for (uint32_t seed = 1; seed <= 3; ++seed) {
    const auto a = random_bf16(256, seed), b = random_bf16(256, seed + 10);
    std::vector<uint16_t> bt(256);
    for (int k = 0; k < 16; ++k)
      for (int n = 0; n < 16; ++n) bt[size_t(n * 16 + k)] = b[size_t(k * 16 + n)];
    std::vector<float> c(256);
    std::mt19937 gen(seed);
    std::normal_distribution<float> dist;
    for (auto& x : c) x = dist(gen);
    std::vector<float> d_trans(256, NAN), d_rows(256, NAN);
    launch(mma_kernel, dim3(1), dim3(32), 0,
           MmaArgs{a.data(), b.data(), bt.data(), c.data(), d_trans.data(), d_rows.data()});
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 16; ++j) {
        double ref = c[size_t(i * 16 + j)];
        for (int k = 0; k < 16; ++k)
          ref += double(bf16_value(a[size_t(i * 16 + k)])) * bf16_value(b[size_t(k * 16 + j)]);
        EXPECT_NEAR(d_trans[size_t(i * 16 + j)], ref, 1e-5 * (1 + std::abs(ref))) << i << "," << j;
        EXPECT_NEAR(d_rows[size_t(i * 16 + j)], ref, 1e-5 * (1 + std::abs(ref))) << i << "," << j;
      }
  }
}

// --- ldmatrix.trans is ldmatrix of the transpose ----------------------------------------

struct TransArgs {
  const uint16_t* m;   // [16][16]
  uint32_t* trans;     // [32][4]: ldmatrix.x4.trans of m
  uint32_t* plain;     // [32][4]: ldmatrix.x4 of m's transpose
  uint32_t* reversed;  // [32][4]: ldmatrix.x4 of m's transpose, row addresses reversed
};

// Matrix q of each x4 is the block at (rows 8 (q & 1), columns 8 (q >> 1)) of
// m, and so the block at (rows 8 (q >> 1), columns 8 (q & 1)) of m^T.
__global__ void transpose_kernel(TransArgs args) {
  __shared__ __align__(16) uint16_t sM[16 * 16];
  __shared__ __align__(16) uint16_t sT[16 * 16];
  const int lane = threadIdx.x, q = lane >> 3, r = lane & 7;
  for (int i = lane; i < 256; i += 32) {
    sM[i] = args.m[i];
    sT[(i % 16) * 16 + i / 16] = args.m[i];
  }
  __syncthreads();
  uint32_t x[4], y[4], z[4];
  simt::ldmatrix_x4(
      x, uint32_t(__cvta_generic_to_shared(&sM[(r + 8 * (q & 1)) * 16 + 8 * (q >> 1)])), true);
  simt::ldmatrix_x4(
      y, uint32_t(__cvta_generic_to_shared(&sT[(r + 8 * (q >> 1)) * 16 + 8 * (q & 1)])), false);
  simt::ldmatrix_x4(
      z, uint32_t(__cvta_generic_to_shared(&sT[(7 - r + 8 * (q >> 1)) * 16 + 8 * (q & 1)])), false);
  for (int i = 0; i < 4; ++i) {
    args.trans[lane * 4 + i] = x[i];
    args.plain[lane * 4 + i] = y[i];
    args.reversed[lane * 4 + i] = z[i];
  }
}

TEST(Simt, LdmatrixTransIsLdmatrixOfTheTranspose) {
  const auto m = random_bf16(256, 7);
  std::vector<uint32_t> trans(128), plain(128), reversed(128);
  launch(transpose_kernel, dim3(1), dim3(32), 0,
         TransArgs{m.data(), trans.data(), plain.data(), reversed.data()});
  EXPECT_EQ(trans, plain);
  // From the PTX definition: lane l holds, in register q, elements
  // (l / 4, 2 (l % 4)) and (l / 4, 2 (l % 4) + 1) of the q-th 8x8 matrix,
  // whose row i starts at the address lane 8 q + i gave.
  for (int l = 0; l < 32; ++l)
    for (int q = 0; q < 4; ++q) {
      const int r0 = 8 * (q & 1), c0 = 8 * (q >> 1), i = l / 4, j = 2 * (l % 4);
      // m^T[c0 + i][r0 + j] = m[r0 + j][c0 + i]
      const uint32_t want = uint32_t(m[size_t((r0 + j) * 16 + c0 + i)]) |
                            uint32_t(m[size_t((r0 + j + 1) * 16 + c0 + i)]) << 16;
      EXPECT_EQ(plain[size_t(l * 4 + q)], want) << l << "," << q;
      const uint32_t want_reversed = uint32_t(m[size_t((r0 + j) * 16 + c0 + 7 - i)]) |
                                     uint32_t(m[size_t((r0 + j + 1) * 16 + c0 + 7 - i)]) << 16;
      EXPECT_EQ(reversed[size_t(l * 4 + q)], want_reversed) << l << "," << q;
    }
}

// --- shuffles, barriers, shared memory ----------------------------------------------------

__global__ void reduce_kernel(const float* in, float* sums, float* broadcast) {
  __shared__ float partial[4];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  float x = in[blockIdx.x * blockDim.x + tid];
  for (int w = 16; w > 0; w /= 2) x += __shfl_xor_sync(0xffffffffu, x, w);
  if (lane == 0) partial[warp] = x;
  __syncthreads();
  if (tid == 0) sums[blockIdx.x] = partial[0] + partial[1] + partial[2] + partial[3];
  broadcast[blockIdx.x * blockDim.x + tid] = __shfl_sync(0xffffffffu, float(tid), 5);
}

TEST(Simt, ShufflesAndBarriersReduceEachBlock) {
  std::vector<float> in(3 * 128);
  for (size_t i = 0; i < in.size(); ++i) in[i] = float(i % 17) - 3.0f;
  std::vector<float> sums(3, NAN), broadcast(in.size(), NAN);
  launch(reduce_kernel, dim3(3), dim3(128), 0, in.data(), sums.data(), broadcast.data());
  for (int b = 0; b < 3; ++b) {
    float ref = 0;
    for (int i = 0; i < 128; ++i) ref += in[size_t(b * 128 + i)];
    EXPECT_FLOAT_EQ(sums[size_t(b)], ref);
    for (int i = 0; i < 128; ++i)
      EXPECT_EQ(broadcast[size_t(b * 128 + i)], float(i / 32 * 32 + 5)) << b << "," << i;
  }
}

__global__ void ballot_atomic_kernel(const int* in, unsigned* ballots, int* total) {
  const int tid = threadIdx.x;
  const unsigned b = __ballot_sync(0xffffffffu, in[tid] > 0);
  if (tid % 32 == 0) ballots[tid / 32] = b;
  atomicAdd(total, in[tid]);
}

TEST(Simt, BallotsAndAtomics) {
  std::vector<int> in(64);
  for (size_t i = 0; i < in.size(); ++i) in[i] = i % 3 == 0 || i == 63 ? int(i) : 0;
  std::vector<unsigned> ballots(2, 0);
  int total = 0;
  launch(ballot_atomic_kernel, dim3(1), dim3(64), 0, in.data(), ballots.data(), &total);
  for (int w = 0; w < 2; ++w) {
    unsigned want = 0;
    for (int l = 0; l < 32; ++l)
      if (in[size_t(32 * w + l)] > 0) want |= 1u << l;
    EXPECT_EQ(ballots[size_t(w)], want) << "warp " << w;
  }
  int sum = 0;
  for (int x : in) sum += x;
  EXPECT_EQ(total, sum);
}

__global__ void dynamic_kernel(float* out) {
  RF_DYNAMIC_SHARED(smem);
  float* s = reinterpret_cast<float*>(smem);
  const int tid = threadIdx.x;
  s[tid] = float(tid);
  __syncthreads();
  out[tid] = s[(tid + 1) % blockDim.x] + s[blockDim.x];  // the last read: never written
}

TEST(Simt, SharedMemoryIsPoisonedAndLimited) {
  std::vector<float> out(64, 0.0f);
  launch(dynamic_kernel, dim3(1), dim3(64), 65 * sizeof(float), out.data());
  for (float x : out) EXPECT_TRUE(std::isnan(x));
  // Over 48 KB only with the kernel's opt-in.
  EXPECT_THROW(launch(dynamic_kernel, dim3(1), dim3(64), 64 * 1024, out.data()), Error);
}

// Each thread copies 16 bytes (4 floats) of `in` to shared memory by
// cp.async in two groups, reads its chunk before and after the waits, and
// writes what it saw.
__global__ void cp_async_kernel(const float* in, float* before, float* after_first,
                                float* after_all, int groups_waited_last) {
  __shared__ __align__(16) float s[2][32 * 4];
  const int tid = threadIdx.x;
  simt_cp_async<16>(uint32_t(__cvta_generic_to_shared(&s[0][4 * tid])), in + 4 * tid);
  simt::cp_async_commit();
  simt_cp_async<16>(uint32_t(__cvta_generic_to_shared(&s[1][4 * tid])), in + 128 + 4 * tid);
  simt::cp_async_commit();
  before[tid] = s[0][4 * tid];
  simt::cp_async_wait(1);  // the first group has landed, the second may not have
  after_first[2 * tid] = s[0][4 * tid + 1];
  after_first[2 * tid + 1] = s[1][4 * tid + 1];
  simt::cp_async_wait(groups_waited_last);
  after_all[tid] = s[1][4 * tid + 3];
}

TEST(Simt, CpAsyncCopiesLandAtTheWaitThatCoversThem) {
  std::vector<float> in(256);
  for (size_t i = 0; i < in.size(); ++i) in[i] = float(i);
  std::vector<float> before(32), after_first(64), after_all(32);
  launch(cp_async_kernel, dim3(1), dim3(32), 0, in.data(), before.data(), after_first.data(),
         after_all.data(), 0);
  for (int t = 0; t < 32; ++t) {
    EXPECT_TRUE(std::isnan(before[size_t(t)])) << "no copy lands before its wait";
    EXPECT_EQ(after_first[size_t(2 * t)], float(4 * t + 1));
    EXPECT_TRUE(std::isnan(after_first[size_t(2 * t + 1)])) << "the newest group is pending";
    EXPECT_EQ(after_all[size_t(t)], float(128 + 4 * t + 3));
  }
  // A thread that exits with a copy no wait covered is reported.
  try {
    launch(cp_async_kernel, dim3(1), dim3(32), 0, in.data(), before.data(), after_first.data(),
           after_all.data(), 1);
    ADD_FAILURE() << "copies never waited for must be reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cp.async"), std::string::npos) << e.what();
  }
  // Destinations are 16-byte aligned shared memory.
  EXPECT_THROW(launch(cp_async_kernel, dim3(1), dim3(32), 0, in.data() + 1, before.data(),
                      after_first.data(), after_all.data(), 0),
               Error)
      << "an unaligned source";
}

// Four-byte copies (cp.async.ca): thread t copies in[stride t + offset] to
// s[t]; they land at the wait like the 16-byte ones, and need only 4-byte
// alignment.
__global__ void cp_async_4_kernel(const float* in, int stride, float* before, float* after) {
  __shared__ float s[32];
  const int tid = threadIdx.x;
  simt_cp_async<4>(uint32_t(__cvta_generic_to_shared(&s[tid])), in + stride * tid);
  simt::cp_async_commit();
  before[tid] = s[tid];
  simt::cp_async_wait(0);
  after[tid] = s[tid];
}

TEST(Simt, FourByteCpAsyncLandsAtItsWait) {
  std::vector<float> in(32 * 12 + 1);
  for (size_t i = 0; i < in.size(); ++i) in[i] = float(i);
  std::vector<float> before(32), after(32);
  // Source rows 12 floats apart, from an odd float: 4-byte aligned, not 16.
  launch(cp_async_4_kernel, dim3(1), dim3(32), 0, in.data() + 1, 12, before.data(), after.data());
  for (int t = 0; t < 32; ++t) {
    EXPECT_TRUE(std::isnan(before[size_t(t)])) << "no copy lands before its wait";
    EXPECT_EQ(after[size_t(t)], float(12 * t + 1));
  }
}

// The flash forward's pipeline in small: tiles of 64 chunks of 4 floats come
// by cp.async into two buffers (thread i copies chunk i), the next tile's
// copies in flight while each thread sums chunk i ^ 32 of the current tile
// (a chunk the other warp copied). `middle`: the barrier after the wait;
// `trailing`: the one before a buffer is refilled.
__global__ void pipeline_kernel(const float* in, int tiles, float* out, bool middle,
                                bool trailing) {
  __shared__ __align__(16) float s[2][64 * 4];
  const int tid = threadIdx.x;
  simt_cp_async<16>(uint32_t(__cvta_generic_to_shared(&s[0][4 * tid])), in + 4 * tid);
  simt::cp_async_commit();
  float sum = 0.0f;
  for (int j = 0; j < tiles; ++j) {
    if (j + 1 < tiles)
      simt_cp_async<16>(uint32_t(__cvta_generic_to_shared(&s[(j + 1) % 2][4 * tid])),
                        in + 256 * (j + 1) + 4 * tid);
    simt::cp_async_commit();
    simt::cp_async_wait(1);
    if (middle) __syncthreads();
    for (int e = 0; e < 4; ++e) sum += s[j % 2][4 * (tid ^ 32) + e];
    if (trailing) __syncthreads();
  }
  simt::cp_async_wait(0);
  out[64 * blockIdx.x + tid] = sum;
}

// A missing barrier in a double-buffered cp.async pipeline shows: without the
// one after the wait, every block reads chunks not landed yet; without
// the one before the refill, a warp-serial block's first warp runs ahead and
// its early copies overwrite a tile the other warp has yet to read.
TEST(Simt, CpAsyncPipelinesNeedBothBarriers) {
  const int tiles = 3, blocks = 4;
  std::vector<float> in(size_t(256 * tiles));
  for (size_t i = 0; i < in.size(); ++i) in[i] = float(i % 97);
  std::vector<float> expected(64);
  for (int tid = 0; tid < 64; ++tid)
    for (int j = 0; j < tiles; ++j)
      for (int e = 0; e < 4; ++e) expected[size_t(tid)] += in[size_t(256 * j + 4 * (tid ^ 32) + e)];
  auto run = [&](bool middle, bool trailing) {
    std::vector<float> out(size_t(64 * blocks));
    launch(pipeline_kernel, dim3(blocks), dim3(64), 0, in.data(), tiles, out.data(), middle,
           trailing);
    std::vector<int> wrong_blocks;
    for (int b = 0; b < blocks; ++b)
      for (int tid = 0; tid < 64; ++tid)
        if (!(out[size_t(64 * b + tid)] == expected[size_t(tid)])) {  // NaN counts as wrong
          wrong_blocks.push_back(b);
          break;
        }
    return wrong_blocks;
  };
  EXPECT_EQ(run(true, true), std::vector<int>{});
  EXPECT_EQ(run(false, true), (std::vector<int>{0, 1, 2, 3})) << "chunks not copied yet";
  EXPECT_EQ(run(true, false), (std::vector<int>{2, 3})) << "the warp-serial blocks see tile 2";
}

__global__ void skipping_kernel(float* out) {
  float x = 1.0f;
  if (threadIdx.x != 3) x = __shfl_xor_sync(0xffffffffu, x, 1);
  out[threadIdx.x] = x;
}

__global__ void diverging_kernel(float* out) {
  float x = 1.0f;
  if (threadIdx.x == 3)
    x = __shfl_sync(0xffffffffu, x, 0);
  else
    x = __shfl_xor_sync(0xffffffffu, x, 1);
  out[threadIdx.x] = x;
}

__global__ void overrunning_kernel(float* out) {
  RF_DYNAMIC_SHARED(smem);
  reinterpret_cast<float*>(smem)[threadIdx.x + 1] = 1.0f;  // one float past the launch's
  out[threadIdx.x] = 0.0f;
}

TEST(Simt, ReportsDeadlockDivergenceAndOverruns) {
  std::vector<float> out(32);
  try {
    launch(skipping_kernel, dim3(1), dim3(32), 0, out.data());
    ADD_FAILURE() << "a lane skipping a shuffle must be reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("deadlock"), std::string::npos) << e.what();
  }
  try {
    launch(diverging_kernel, dim3(1), dim3(32), 0, out.data());
    ADD_FAILURE() << "lanes at different collectives must be reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("divergence"), std::string::npos) << e.what();
  }
  EXPECT_THROW(launch(overrunning_kernel, dim3(1), dim3(32), 32 * sizeof(float), out.data()),
               Error);
}

}  // namespace
}  // namespace roformer
