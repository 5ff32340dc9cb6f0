// The communicator a launched process trains with: none for a plain run
// (the Trainer uses its single-process one), MPI when a launcher started
// more than one rank. `roformer pretrain` and `finetune` make one per run.
#pragma once

#include <memory>

#include "core/device.h"
#include "train/communicator.h"
#include "train/distributed/launch.h"

namespace roformer::distributed {

// The device this rank trains on: `configured` (run.device) for the CPU or a
// single process; for CUDA ranks cuda:<local rank>, wrapping around the
// visible GPUs when there are fewer (local ranks 0 and 2 of 3 on 2 GPUs both
// take cuda:0, sharing it).
Device rank_device(Device configured, const LaunchInfo& launch);

// Null when `launch` is a single process (and not forced). Otherwise MPI, or NCCL (on MPI)
// when `device` is a GPU, the build has NCCL, and every rank has a GPU of its
// own (NCCL refuses two ranks on one GPU; ranks sharing GPUs sum their
// gradients with MPI through host memory, which is slower but works).
// Throws InputError when the launch has several ranks and this build has no
// MPI, or MPI's view disagrees with the launcher's variables.
std::unique_ptr<Communicator> make_communicator(const LaunchInfo& launch, double timeout_s,
                                                Device device = Device::cpu());

bool built_with_mpi();

}  // namespace roformer::distributed
