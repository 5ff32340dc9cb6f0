// Hopper's warpgroup products as the flash kernels issue them
// (core/cuda/kernels/wgmma.cuh, through tests/cuda/wgmma_probe.cu) against
// the plain matrix products: the descriptors, the 128-byte swizzle and the
// register layouts checked apart from the attention kernel, on a GPU of
// compute capability 9.0 (the emulator's counterpart:
// tests/simt/test_simt_wgmma.cpp).
#include <gtest/gtest.h>

#include "core/cuda/kernels/flash_attention.h"
#include "tests/cuda/gpu_test.h"
#include "tests/cuda/wgmma_probe.h"
#include "tests/cuda/wgmma_probe_cases.h"

namespace roformer {
namespace {

using testing::kGpu;

TEST(CudaWgmma, ProductsOfSwizzledTilesAreTheMatrixProducts) {
  RF_REQUIRE_GPU();
  if (!kernels::cuda::flash_wgmma_available(0))
    GTEST_SKIP() << "the GPU is not compute capability 9.0: no wgmma";
  testing::expect_wgmma_products_are_matrix_products([](const std::vector<uint16_t>& a,
                                                        const std::vector<uint16_t>& b,
                                                        const std::vector<float>& c) {
    // bf16 bits travel as i16 pairs of an i32 tensor: 2048 words each.
    auto words = [](const std::vector<uint16_t>& bits) {
      std::vector<int32_t> w(bits.size() / 2);
      std::memcpy(w.data(), bits.data(), bits.size() * 2);
      return Tensor::from_vector(w, {int64_t(w.size())}).to(kGpu);
    };
    const Tensor da = words(a), db = words(b);
    const Tensor dc = Tensor::from_vector(c, {int64_t(c.size())}).to(kGpu);
    const Tensor ss = Tensor::zeros({64 * 64}, DType::f32, kGpu);
    const Tensor rs = Tensor::zeros({64 * 64}, DType::f32, kGpu);
    const Tensor ts = Tensor::zeros({64 * 64}, DType::f32, kGpu);
    testing::wgmma_products(static_cast<const uint16_t*>(da.data()),
                            static_cast<const uint16_t*>(db.data()), dc.data_as<float>(),
                            ss.data_as<float>(), rs.data_as<float>(), ts.data_as<float>());
    auto host_of = [](const Tensor& t) { return t.to(Device::cpu()).to_vector<float>(); };
    return testing::WgmmaProducts{host_of(ss), host_of(rs), host_of(ts)};
  });
}

}  // namespace
}  // namespace roformer
