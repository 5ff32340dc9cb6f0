#include <gtest/gtest.h>

#include <string>

#include "core/cuda/cuda_backend.h"
#include "core/ops.h"

namespace roformer {
namespace {

TEST(CudaDevice, WithoutTheBackendCudaStorageIsAClearError) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is present: the backend would initialise";
  std::string why;
  EXPECT_FALSE(cuda::init_backend(&why));
  EXPECT_NE(why.find("no CUDA device"), std::string::npos);
  try {
    Tensor::empty({4}, DType::f32, Device::cuda(0));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace roformer
