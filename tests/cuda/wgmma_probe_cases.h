// The check of tests/cuda/wgmma_probe.cu's products, on a GPU
// (test_cuda_wgmma.cpp) and in the SIMT emulator (tests/simt/test_simt_wgmma.cpp):
// random bf16 a and b and f32 c, against the plain matrix products (a b,
// c + a b, a^T b).
#pragma once

#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace roformer::testing {

struct WgmmaProducts {
  std::vector<float> ss, rs, ts;  // [64][64]: a b, c + a b, a^T b
};

// `products(a, b, c)` runs the probe on bf16 bits a, b and f32 c ([64][64]
// each, row-major) and returns its results.
template <class Products>
void expect_wgmma_products_are_matrix_products(Products products) {
  for (uint32_t seed = 1; seed <= 2; ++seed) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> dist;
    std::vector<uint16_t> a(64 * 64), b(64 * 64);
    std::vector<float> av(64 * 64), bv(64 * 64), c(64 * 64);
    auto draw = [&](std::vector<uint16_t>& bits, std::vector<float>& values) {
      for (size_t i = 0; i < bits.size(); ++i) {
        const __nv_bfloat16 x = __float2bfloat16_rn(dist(gen));
        std::memcpy(&bits[i], &x, 2);
        values[i] = __bfloat162float(x);
      }
    };
    draw(a, av);
    draw(b, bv);
    for (auto& x : c) x = dist(gen);
    const WgmmaProducts got = products(a, b, c);
    ASSERT_EQ(got.ss.size(), c.size());
    ASSERT_EQ(got.rs.size(), c.size());
    ASSERT_EQ(got.ts.size(), c.size());
    for (int i = 0; i < 64; ++i)
      for (int j = 0; j < 64; ++j) {
        double ref = 0.0, magnitude = 0.0;
        for (int k = 0; k < 64; ++k) {
          const double term = double(av[size_t(i * 64 + k)]) * bv[size_t(k * 64 + j)];
          ref += term;
          magnitude += std::abs(term);
        }
        const size_t at = size_t(i * 64 + j);
        // f32 accumulation in the tensor cores: within a few f32 roundings.
        const double tol = 1e-5 * (1.0 + magnitude + std::abs(c[at]));
        ASSERT_NEAR(got.ss[at], ref, tol)
            << "a b at " << i << ", " << j << " (seed " << seed << ")";
        ASSERT_NEAR(got.rs[at], c[at] + ref, tol)
            << "c + a b at " << i << ", " << j << " (seed " << seed << ")";
        double ref_t = 0.0, magnitude_t = 0.0;
        for (int k = 0; k < 64; ++k) {
          const double term = double(av[size_t(k * 64 + i)]) * bv[size_t(k * 64 + j)];
          ref_t += term;
          magnitude_t += std::abs(term);
        }
        ASSERT_NEAR(got.ts[at], ref_t, 1e-5 * (1.0 + magnitude_t))
            << "a^T b at " << i << ", " << j << " (seed " << seed << ")";
      }
  }
}

}  // namespace roformer::testing
