// cuDNN's fused attention (core/cuda/kernels/cudnn_attention.cu, the vendor
// engine) is a library on the device: the emulated attention kernels get a
// version that refuses, so a test asking for it learns so.
#include "tests/simt/kernel_emulation.h"
//
#include "core/cuda/kernels/cudnn_attention.h"

namespace roformer::kernels::cuda {

void cudnn_attention_forward(Stream, const AttentionParams&, const KernelTensor&,
                             const KernelTensor&, const KernelTensor&, const KernelTensor&,
                             const KernelTensor&, const KernelTensor&) {
  throw Error("simt: cuDNN's fused attention does not run in the emulator");
}
void cudnn_attention_backward(Stream, const AttentionParams&, const KernelTensor&,
                              const KernelTensor&, const KernelTensor&, const KernelTensor&,
                              const KernelTensor&, const KernelTensor&, const KernelTensor&,
                              const KernelTensor&, const KernelTensor&, const KernelTensor&) {
  throw Error("simt: cuDNN's fused attention does not run in the emulator");
}

}  // namespace roformer::kernels::cuda
