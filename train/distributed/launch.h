// Who started this process: mpirun (OpenMPI's OMPI_COMM_WORLD_* variables),
// another PMI launcher (PMI_RANK/PMI_SIZE: MPICH, Intel MPI), or Slurm's
// srun (SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID). Without any of them the
// process is rank 0 of 1, exactly a plain run.
#pragma once

#include <functional>
#include <string>

namespace roformer::distributed {

struct LaunchInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;    // rank among the processes of this machine (picks cuda:<local rank>)
  std::string launcher;  // "mpirun", "pmi", "slurm"; "" when none
  // ROFORMER_FORCE_COMMUNICATOR=1: the MPI (or NCCL) communicator even for
  // one rank, so its path can be checked at world size 1 (the GPU check).
  bool forced = false;
  bool distributed() const { return world_size > 1; }
  bool needs_communicator() const { return distributed() || forced; }
};

// Reads the launcher's variables through `getenv` (std::getenv by default;
// tests pass their own). Throws InputError naming a variable that is not a
// number or a rank outside [0, world size).
LaunchInfo detect_launch(const std::function<const char*(const char*)>& getenv = {});

}  // namespace roformer::distributed
