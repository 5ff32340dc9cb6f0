// The CUDA kernel table: &cuda::<name> for every entry of the list, so a
// listed kernel without a CUDA implementation fails the link. Compiled into
// roformer_kernels_cuda when ROFORMER_CUDA_KERNELS is on (core/CMakeLists.txt).
#include "core/kernels/kernel_list.h"

namespace roformer::kernels {

#define ROFORMER_CUDA_ENTRY(name, ...) &cuda::name,
const KernelTable cuda_kernel_table = {ROFORMER_KERNELS(ROFORMER_CUDA_ENTRY)};
#undef ROFORMER_CUDA_ENTRY

}  // namespace roformer::kernels
