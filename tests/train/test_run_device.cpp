// run.device and --device: a device that cannot be used stops a command at
// once, naming the key and the reason (on this machine: no GPU, or no CUDA in
// the build), before any data is read. The GPU side of the trainer runs in
// scripts/gpu_check.sh on a machine with one.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "core/device_backend.h"
#include "tests/test_support.h"
#include "train/config.h"
#include "train/finetune.h"
#include "train/pretrain.h"
#include "train/run_device.h"

namespace roformer {
namespace {

using testing::error_of;

bool gpu_visible() {
  return device_count(DeviceType::cuda) > 0;
}

TEST(RunDevice, TheCpuIsAlwaysUsable) {
  EXPECT_EQ(checked_device(Device::cpu(), "run.device"), Device::cpu());
  EXPECT_EQ(device_option("cpu", "--device"), Device::cpu());
}

TEST(RunDevice, AnUnusableGpuNamesTheKeyAndTheReason) {
  if (gpu_visible()) GTEST_SKIP() << "a GPU is visible here: cuda:0 is usable";
  const std::string e = error_of<InputError>([] { checked_device(Device::cuda(0), "run.device"); });
  EXPECT_NE(e.find("run.device: cuda:0 cannot be used: "), std::string::npos) << e;
  // Either the build has no CUDA backend or the machine shows no GPU.
  EXPECT_TRUE(e.find("no CUDA backend") != std::string::npos ||
              e.find("0 CUDA devices are visible") != std::string::npos)
      << e;
  EXPECT_NE(e.find("(set it to cpu)"), std::string::npos) << e;
}

TEST(RunDevice, AGpuIndexBeyondTheVisibleOnesIsRefused) {
  const int n = device_count(DeviceType::cuda);
  const std::string e =
      error_of<InputError>([n] { checked_device(Device::cuda(n), "run.device"); });
  EXPECT_NE(e.find("run.device: cuda:" + std::to_string(n) + " cannot be used"), std::string::npos)
      << e;
}

TEST(RunDevice, TheDeviceOptionNamesItselfForBadText) {
  EXPECT_EQ(error_of<InputError>([] { device_option("tpu", "--device"); }),
            "--device: expected cpu, cuda or cuda:N, got 'tpu'");
  EXPECT_EQ(error_of<InputError>([] { device_option("cuda:x", "--device"); }),
            "--device: expected cpu, cuda or cuda:N, got 'cuda:x'");
}

// The device is checked before the shards (which do not exist here) are read.
TEST(RunDevice, PretrainStopsAtRunDeviceBeforeReadingData) {
  if (gpu_visible()) GTEST_SKIP() << "a GPU is visible here: cuda:0 is usable";
  const std::string yaml = std::string("run: {device: cuda, dir: ") +
                           (std::filesystem::temp_directory_path() / "rf_run_device_x").string() +
                           "}\ndata: {vocab: " ROFORMER_FIXTURES_DIR
                           "/bert-base-uncased-vocab.txt, shard_dir: /nonexistent/shards}\n"
                           "stages: [{max_seq_len: 16, batch_size: 2, steps: 1}]\n";
  const Config config = parse_config_string(yaml, "gpu.yaml");
  const std::string e = error_of<InputError>([&] { run_pretrain(config); });
  EXPECT_EQ(e.rfind("gpu.yaml: run.device: cuda:0 cannot be used: ", 0), 0u) << e;
}

TEST(RunDevice, FinetuneStopsAtRunDeviceBeforeReadingData) {
  if (gpu_visible()) GTEST_SKIP() << "a GPU is visible here: cuda:0 is usable";
  const std::string yaml =
      "run: {device: 'cuda:1'}\n"
      "finetune: {task: classification, train_file: /nonexistent/train.jsonl}\n"
      "data: {vocab: " ROFORMER_FIXTURES_DIR "/bert-base-uncased-vocab.txt}\n";
  const Config config = parse_config_string(yaml, "ft.yaml");
  const std::string e = error_of<InputError>([&] { run_finetune(config); });
  EXPECT_EQ(e.rfind("ft.yaml: run.device: cuda:1 cannot be used: ", 0), 0u) << e;
}

TEST(RunDevice, CpuMemoryFiguresComeFromTheHostAllocator) {
  const DeviceMemory before = device_memory(Device::cpu());
  {
    const Tensor t = Tensor::zeros({1 << 20});
    const DeviceMemory during = device_memory(Device::cpu());
    EXPECT_GE(during.allocated_mb, before.allocated_mb + 3.9);
    EXPECT_GE(during.reserved_mb, during.allocated_mb);
  }
  release_device_cache(Device::cpu());
  EXPECT_LE(device_memory(Device::cpu()).reserved_mb, before.reserved_mb + 0.01);
}

}  // namespace
}  // namespace roformer
