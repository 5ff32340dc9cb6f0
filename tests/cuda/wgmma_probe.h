#pragma once

#include <cstdint>

namespace roformer::testing {

// The flash kernels' wgmma building blocks (core/cuda/kernels/wgmma.cuh) on
// one warpgroup, as they are used: a and b [64][64] bf16 bits, row-major,
// stored in SwizzledTile layout; ss = a b with a and b^T read K-major (S =
// Q K^T), rs = c + a b with a from registers and b read N-major (O += P V),
// ts = a^T b with a read M-major and b N-major (dQ = dS K from dS^T); c,
// ss, rs, ts [64][64] f32. Device memory on a GPU (compute capability 9.0),
// host memory in the SIMT emulator (tests/simt/wgmma_probe_emulated.cpp).
void wgmma_products(const uint16_t* a, const uint16_t* b, const float* c, float* ss, float* rs,
                    float* ts);

}  // namespace roformer::testing
