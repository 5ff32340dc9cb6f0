// The communicator a launched process trains with: none for a plain run
// (the Trainer uses its single-process one), MPI when a launcher started
// more than one rank. `roformer pretrain` and `finetune` make one per run.
#pragma once

#include <memory>

#include "train/communicator.h"
#include "train/distributed/launch.h"

namespace roformer::distributed {

// Null when `launch` is a single process. Throws InputError when the launch
// has several ranks and this build has no MPI, or MPI's view disagrees with
// the launcher's variables.
std::unique_ptr<Communicator> make_communicator(const LaunchInfo& launch, double timeout_s);

// For a rank that failed: ends every rank's process with `exit_code` when
// `comm` is an MPI communicator (the others may be blocked in a collective
// and must not wait for the timeout); returns otherwise.
void abort_all_ranks(Communicator* comm, int exit_code);

bool built_with_mpi();

}  // namespace roformer::distributed
