// simt_cuda_kernel_table (emulated_kernels.h): every kernel of the list as
// the emulator runs it. The device services and the cuBLASLt products have
// no emulated version and refuse.
#include "core/error.h"
#include "tests/simt/emulated_kernels.h"

namespace roformer::kernels {

namespace simt_cuda {
namespace {
[[noreturn]] void not_emulated(const char* kernel) {
  throw Error(std::string("simt: ") + kernel + " is not emulated (a device service or cuBLASLt)");
}
}  // namespace

Stream default_stream(int) {
  not_emulated("default_stream");
}
void take_error(Stream, KernelError*) {
  not_emulated("take_error");
}
void synchronize(Stream) {
  not_emulated("synchronize");
}
void matmul(Stream, KT, KT, KT, KT) {
  not_emulated("matmul");
}
void matmul_accumulate(Stream, KT, KT, KT) {
  not_emulated("matmul_accumulate");
}
void linear_weight_grads(Stream, KT, KT, KT, KT, bool) {
  not_emulated("linear_weight_grads");
}
void gemm_gelu_forward(Stream, KT, KT, KT, KT, KT) {
  not_emulated("gemm_gelu_forward");
}
void gemm_dgelu_backward(Stream, KT, KT, KT, KT, KT) {
  not_emulated("gemm_dgelu_backward");
}
}  // namespace simt_cuda

const KernelTable simt_cuda_kernel_table = {
#define ROFORMER_SIMT_TABLE_ENTRY(name, ...) &simt_cuda::name,
    ROFORMER_KERNELS(ROFORMER_SIMT_TABLE_ENTRY)
#undef ROFORMER_SIMT_TABLE_ENTRY
};

}  // namespace roformer::kernels
