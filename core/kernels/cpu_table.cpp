// The CPU kernel table: &cpu::<name> for every entry of the list.
#include "core/kernels/kernel_list.h"

namespace roformer::kernels {

#define ROFORMER_CPU_ENTRY(name, ...) &cpu::name,
const KernelTable cpu_kernel_table = {ROFORMER_KERNELS(ROFORMER_CPU_ENTRY)};
#undef ROFORMER_CPU_ENTRY

}  // namespace roformer::kernels
