// TensorBoard event files: CRC-32C against the standard check values, the
// Event encoding against bytes worked out by hand from the protocol-buffer
// rules, and a write / read-back round trip with every CRC verified.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include "core/error.h"
#include "tests/test_support.h"
#include "train/metrics.h"
#include "train/tensorboard.h"

namespace roformer {
namespace {

namespace fs = std::filesystem;
using testing::error_of;

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("roformer_tb_" + name);
  fs::remove_all(dir);
  return dir;
}

TEST(Crc32c, StandardCheckValues) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);  // the CRC catalogue's check value
  const std::string zeros(32, '\0');
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);  // RFC 3720, B.4
  const std::string ones(32, '\xFF');
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  const uint32_t c = crc32c("123456789", 9);
  EXPECT_EQ(masked_crc32c("123456789", 9), ((c >> 15) | (c << 17)) + 0xA282EAD8u);
}

TEST(TensorBoard, ScalarEventIsTheProtobufEncodingWorkedByHand) {
  const fs::path dir = fresh_dir("encoding");
  fs::path file;
  {
    TensorBoardWriter w(dir);
    w.add_scalar("a", 3, 1.0, 0.5);
    w.flush();
    file = w.path();
  }
  EXPECT_EQ(file.parent_path(), dir);
  EXPECT_EQ(file.filename().string().rfind("events.out.tfevents.", 0), 0u);
  const std::string bytes = read_bytes(file);
  // Skip the version record: 8 + 4 + its length + 4 bytes.
  uint64_t n0;
  std::memcpy(&n0, bytes.data(), 8);
  const std::string rec = bytes.substr(12 + n0 + 4);
  // Event{wall_time: 0.5 (field 1, fixed64), step: 3 (field 2, varint),
  //       summary (field 5): Summary{value (field 1): Value{tag "a" (1), simple_value 1.0f (2)}}}
  const unsigned char expected[] = {0x09, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xE0, 0x3F,  // 0.5
                                    0x10, 0x03,                                            // step
                                    0x2A, 0x0A, 0x0A, 0x08,                           // summary
                                    0x0A, 0x01, 'a',  0x15, 0x00, 0x00, 0x80, 0x3F};  // value
  uint64_t n;
  std::memcpy(&n, rec.data(), 8);
  ASSERT_EQ(n, sizeof expected);
  EXPECT_EQ(std::memcmp(rec.data() + 12, expected, sizeof expected), 0);
  uint32_t len_crc, data_crc;
  std::memcpy(&len_crc, rec.data() + 8, 4);
  std::memcpy(&data_crc, rec.data() + 12 + n, 4);
  EXPECT_EQ(len_crc, masked_crc32c(rec.data(), 8));
  EXPECT_EQ(data_crc, masked_crc32c(expected, sizeof expected));
  EXPECT_EQ(rec.size(), 12 + n + 4);
}

TEST(TensorBoard, RoundTripWithTagsStepsAndValues) {
  const fs::path dir = fresh_dir("roundtrip");
  fs::path file;
  {
    TensorBoardWriter w(dir);
    for (int64_t step = 10; step <= 30; step += 10) {
      w.add_scalar("train/loss", step, 10.0 / double(step));
      w.add_scalar("train/lr", step, 1e-3 * double(step));
    }
    w.add_scalar("validation/accuracy@128", 30, 0.25);
    file = w.path();
  }
  const TensorBoardEvents ev = read_tensorboard_events(file);
  EXPECT_EQ(ev.file_version, "brain.Event:2");
  ASSERT_EQ(ev.scalars.size(), 7u);
  EXPECT_EQ(ev.scalars[0].tag, "train/loss");
  EXPECT_EQ(ev.scalars[0].step, 10);
  EXPECT_FLOAT_EQ(ev.scalars[0].value, 1.0f);
  EXPECT_EQ(ev.scalars[5].tag, "train/lr");
  EXPECT_EQ(ev.scalars[5].step, 30);
  EXPECT_FLOAT_EQ(ev.scalars[5].value, 0.03f);
  EXPECT_EQ(ev.scalars[6].tag, "validation/accuracy@128");
  EXPECT_GT(ev.scalars[6].wall_time, 1.6e9);  // seconds since the epoch
}

TEST(TensorBoard, CorruptionIsReportedWithFileAndOffset) {
  const fs::path dir = fresh_dir("corrupt");
  fs::path file;
  {
    TensorBoardWriter w(dir);
    w.add_scalar("x", 1, 2.0);
    file = w.path();
  }
  std::string bytes = read_bytes(file);
  uint64_t n0;
  std::memcpy(&n0, bytes.data(), 8);
  const size_t second = 12 + n0 + 4;
  bytes[second + 14] ^= 0x01;  // a payload byte of the second record
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
  const std::string msg = error_of([&] { read_tensorboard_events(file); });
  EXPECT_NE(msg.find(file.string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("byte " + std::to_string(second)), std::string::npos) << msg;
  EXPECT_NE(msg.find("data CRC"), std::string::npos) << msg;
  // A truncated file names the truncation.
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes.substr(0, second + 5);
  EXPECT_NE(error_of([&] { read_tensorboard_events(file); }).find("truncated"), std::string::npos);
}

TEST(TensorBoard, UnwritableDirectoryIsAClearError) {
  const fs::path blocker = fresh_dir("blocker");
  std::ofstream(blocker) << "a file, not a directory";
  const std::string msg = error_of([&] { TensorBoardWriter w(blocker / "tb"); });
  EXPECT_NE(msg.find((blocker / "tb").string()), std::string::npos) << msg;
  fs::remove(blocker);
}

TEST(TensorBoard, MetricsLogMirrorsNumericFieldsAsScalars) {
  const fs::path dir = fresh_dir("metrics");
  fs::create_directories(dir);
  {
    MetricsLog log(dir / "metrics.jsonl", true, false);
    log.write({{"type", "stage"}, {"stage", 1}, {"global_step", 0}, {"max_seq_len", 128}});
    log.write({{"type", "train"},
               {"stage", 1},
               {"step_in_stage", 10},
               {"global_step", 10},
               {"loss", 7.5},
               {"last_step_loss", "7.25"},
               {"lr", 1e-4}});
    log.write({{"type", "validation"}, {"global_step", 10}, {"max_seq_len", 128}, {"loss", 7.0}});
    log.write({{"type", "note"}, {"text", "no step: not a scalar"}});
  }
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir / "tb")) files.push_back(e.path());
  ASSERT_EQ(files.size(), 1u);
  const TensorBoardEvents ev = read_tensorboard_events(files[0]);
  std::vector<std::string> tags;
  for (const auto& s : ev.scalars) tags.push_back(s.tag + "@" + std::to_string(s.step));
  const std::vector<std::string> expected{
      "stage/max_seq_len@0", "train/last_step_loss@10",   "train/loss@10",
      "train/lr@10",         "validation/seq128/loss@10", "validation/seq128/max_seq_len@10"};
  EXPECT_EQ(tags, expected);
  EXPECT_FLOAT_EQ(ev.scalars[1].value, 7.25f);
}

}  // namespace
}  // namespace roformer
