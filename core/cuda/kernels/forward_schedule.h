// The wgmma attention forward's schedules of the key tiles
// (set_flash_forward_schedule, flash_attention.h), in a header of their own:
// the tests' settings name them without the kernels' declarations (which the
// SIMT emulator's build renames).
#pragma once

namespace roformer::kernels::cuda {

enum class ForwardSchedule { automatic, in_step, pipelined };

}  // namespace roformer::kernels::cuda
