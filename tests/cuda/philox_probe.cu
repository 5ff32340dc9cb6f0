// A test kernel: Philox words drawn on the device, to compare with the host.
#include "core/cuda/check.h"
#include "core/philox.h"
#include "tests/cuda/philox_probe.h"

namespace roformer::testing {

namespace {
__global__ void draw_words(uint64_t seed, uint64_t first, int64_t n, uint32_t* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = philox_word(seed, first + uint64_t(i));
}
}  // namespace

void philox_words_on_device(uint64_t seed, uint64_t first, int64_t n, uint32_t* out) {
  draw_words<<<unsigned((n + 127) / 128), 128>>>(seed, first, n, out);
  RF_CUDA_CHECK_LAUNCH(draw_words);
  RF_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace roformer::testing
