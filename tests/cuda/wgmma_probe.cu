// A test kernel: the wgmma wrappers and descriptors of the flash kernels
// (core/cuda/kernels/wgmma.cuh) on one warpgroup, so a GPU checks the
// instructions' layouts on their own, apart from the attention kernel.
// Built for sm_90a (tests/cuda/CMakeLists.txt) and, for the emulator, by
// tests/simt/wgmma_probe_emulated.cpp.
#include "core/cuda/kernels/wgmma.cuh"
#include "tests/cuda/wgmma_probe.h"

namespace roformer::testing {

namespace {

using kernels::cuda::bf16_t;
using kernels::cuda::SwizzledTile;

__global__ void wgmma_probe_kernel(const uint16_t* a, const uint16_t* b, const float* c, float* ss,
                                   float* rs, float* ts) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(ROFORMER_SIMT_EMULATION)
  namespace k = kernels::cuda;
  RF_DYNAMIC_SHARED(smem);
  uint16_t* sA = reinterpret_cast<uint16_t*>(k::swizzle_aligned(smem));
  uint16_t* sBt = sA + 64 * 64;  // b^T: rows are b's columns (read K-major, as K)
  uint16_t* sB = sBt + 64 * 64;  // b (read N-major, as V)
  const int T = threadIdx.x, warp = T / 32, lane = T % 32, g = lane / 4, t = lane % 4;
  for (int e = T; e < 64 * 64; e += 128) {
    const int r = e / 64, col = e % 64;
    sA[SwizzledTile::chunk(r, col / 8) + col % 8] = a[e];
    sBt[SwizzledTile::chunk(col, r / 8) + r % 8] = b[e];
    sB[SwizzledTile::chunk(r, col / 8) + col % 8] = b[e];
  }
  k::fence_shared_for_wgmma();
  __syncthreads();
  const bf16_t* tile_a = reinterpret_cast<const bf16_t*>(sA);
  const bf16_t* tile_bt = reinterpret_cast<const bf16_t*>(sBt);
  const bf16_t* tile_b = reinterpret_cast<const bf16_t*>(sB);
  float s[8][4], o[8][4], u[8][4];
  // Accumulator element (nt, e): row 16 warp + g + 8 (e >> 1), column 8 nt + 2 t + (e & 1).
  auto at = [&](int nt, int e) {
    return (16 * warp + g + 8 * (e >> 1)) * 64 + 8 * nt + 2 * t + (e & 1);
  };
  for (int nt = 0; nt < 8; ++nt)
    for (int e = 0; e < 4; ++e) o[nt][e] = c[at(nt, e)];
  // a's rows of this warp in mma.sync's A layout, every k step, written
  // before the fence (no register a wgmma reads may change after it).
  uint32_t frag[4][4];
  for (int ks = 0; ks < 4; ++ks)
    for (int j = 0; j < 4; ++j) {
      const int row = 16 * warp + g + 8 * (j & 1), col = 16 * ks + 2 * t + 8 * (j >> 1);
      frag[ks][j] = uint32_t(a[row * 64 + col]) | (uint32_t(a[row * 64 + col + 1]) << 16);
    }
  k::wgmma_fence();
  for (int ks = 0; ks < 4; ++ks)
    k::wgmma_ss(s, k::k_major_step(tile_a, ks), k::k_major_step(tile_bt, ks), ks > 0);
  for (int ks = 0; ks < 4; ++ks) k::wgmma_rs(o, frag[ks], k::n_major_step(tile_b, ks));
  // a^T b: A M-major (trans-a: its k along sA's rows), B N-major (trans-b).
  for (int ks = 0; ks < 4; ++ks)
    k::wgmma_ss<true, true>(u, k::n_major_step(tile_a, ks), k::n_major_step(tile_b, ks), ks > 0);
  k::wgmma_commit();
  k::wgmma_wait<0>();
  k::fence_accumulator(s);
  k::fence_accumulator(o);
  k::fence_accumulator(u);
  for (int nt = 0; nt < 8; ++nt)
    for (int e = 0; e < 4; ++e) {
      ss[at(nt, e)] = s[nt][e];
      rs[at(nt, e)] = o[nt][e];
      ts[at(nt, e)] = u[nt][e];
    }
#else
  (void)a, (void)b, (void)c, (void)ss, (void)rs, (void)ts;
#if defined(__CUDA_ARCH__)
  __trap();  // built without sm_90a's features: fail, not pass on unwritten outputs
#endif
#endif
}

constexpr size_t kProbeShared = kernels::cuda::kSwizzleAtom + 3 * 64 * 64 * sizeof(uint16_t);

}  // namespace

void wgmma_products(const uint16_t* a, const uint16_t* b, const float* c, float* ss, float* rs,
                    float* ts) {
  using namespace kernels::cuda;  // allow_shared (the emulator's, in its build)
  allow_shared(wgmma_probe_kernel, kProbeShared);
  RF_LAUNCH(wgmma_probe_kernel, dim3(1), dim3(128), kProbeShared, cudaStream_t{}, a, b, c, ss, rs,
            ts);
#if !defined(ROFORMER_SIMT_EMULATION)
  RF_CUDA_CHECK(cudaDeviceSynchronize());
#endif
}

}  // namespace roformer::testing
