// Launch detection (which launcher, rank, world size) and the split of a
// global batch over ranks and micro-batches.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "core/error.h"
#include "train/distributed/batch_split.h"
#include "train/distributed/launch.h"

namespace roformer::distributed {
namespace {

LaunchInfo detect(const std::map<std::string, std::string>& env) {
  return detect_launch([&](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(Launch, NoLauncherIsOneProcess) {
  const LaunchInfo info = detect({{"HOME", "/root"}});
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.world_size, 1);
  EXPECT_EQ(info.launcher, "");
  EXPECT_FALSE(info.distributed());
}

TEST(Launch, ForcedCommunicatorAtOneRank) {
  const LaunchInfo alone = detect({{"ROFORMER_FORCE_COMMUNICATOR", "1"}});
  EXPECT_EQ(alone.world_size, 1);
  EXPECT_FALSE(alone.distributed());
  EXPECT_TRUE(alone.needs_communicator());
  EXPECT_FALSE(detect({{"ROFORMER_FORCE_COMMUNICATOR", "0"}}).needs_communicator());
  EXPECT_FALSE(detect({}).needs_communicator());
  const LaunchInfo two = detect({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
  EXPECT_TRUE(two.needs_communicator());
}

TEST(Launch, OpenMpiVariables) {
  const LaunchInfo info = detect({{"OMPI_COMM_WORLD_RANK", "3"},
                                  {"OMPI_COMM_WORLD_SIZE", "4"},
                                  {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}});
  EXPECT_EQ(info.launcher, "mpirun");
  EXPECT_EQ(info.rank, 3);
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_TRUE(info.distributed());
}

TEST(Launch, SlurmVariablesAndMpiWinsOverSlurm) {
  const LaunchInfo slurm =
      detect({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"}});
  EXPECT_EQ(slurm.launcher, "slurm");
  EXPECT_EQ(slurm.rank, 5);
  EXPECT_EQ(slurm.world_size, 8);
  EXPECT_EQ(slurm.local_rank, 1);
  // mpirun inside a Slurm allocation: the job's variables describe the
  // allocation, MPI's the processes this launch started.
  const LaunchInfo both = detect({{"SLURM_PROCID", "0"},
                                  {"SLURM_NTASKS", "1"},
                                  {"OMPI_COMM_WORLD_RANK", "1"},
                                  {"OMPI_COMM_WORLD_SIZE", "2"}});
  EXPECT_EQ(both.launcher, "mpirun");
  EXPECT_EQ(both.world_size, 2);
}

TEST(Launch, BadValuesNameTheVariable) {
  EXPECT_NE(error_of([] {
              detect({{"PMI_RANK", "x"}, {"PMI_SIZE", "2"}});
            }).find("PMI_RANK='x'"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              detect({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "2"}});
            }).find("SLURM_PROCID=2 is not a rank of SLURM_NTASKS=2"),
            std::string::npos);
}

TEST(BatchSplit, RanksThenMicroBatches) {
  const BatchSplit one = split_batch(8, 8, 1, "s");
  EXPECT_EQ(one.per_rank, 8);
  EXPECT_EQ(one.micro_batches, 1);
  // micro_batch_size defaults to the batch: it is lowered to a rank's share.
  const BatchSplit two = split_batch(8, 8, 2, "s");
  EXPECT_EQ(two.micro_batch_size, 4);
  EXPECT_EQ(two.micro_batches, 1);
  const BatchSplit four = split_batch(8, 2, 2, "s");
  EXPECT_EQ(four.micro_batch_size, 2);
  EXPECT_EQ(four.micro_batches, 2);
  // Rank 1's second micro-batch follows every rank's first: rows 6 and 7.
  EXPECT_EQ(four.first_row(1, 2, 1), 6);
  EXPECT_EQ(four.first_row(0, 2, 1), 4);
}

TEST(BatchSplit, ErrorsNameTheStageAndTheNumbers) {
  const std::string ranks = error_of([] { split_batch(9, 9, 2, "tiny.yaml: stages[1]"); });
  EXPECT_NE(ranks.find("tiny.yaml: stages[1]: batch_size 9 does not split over 2 ranks"),
            std::string::npos)
      << ranks;
  const std::string micro = error_of([] { split_batch(12, 4, 2, "stages[0]"); });
  EXPECT_NE(micro.find("6 sequences per rank, which micro_batch_size 4 does not divide"),
            std::string::npos)
      << micro;
}

}  // namespace
}  // namespace roformer::distributed
