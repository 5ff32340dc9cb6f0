// TensorBoard event files written without Python or protobuf libraries: a run
// directory's `tb/` holds `events.out.tfevents.*` files that `tensorboard
// --logdir` reads. The format is TFRecord framing (length, masked CRC32C of
// the length, payload, masked CRC32C of the payload) around `Event` protocol
// buffers, of which we need four fields: wall_time, step, file_version and a
// summary of scalar values.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

namespace roformer {

// CRC-32C (Castagnoli), as TFRecord uses it; and TFRecord's masked form.
uint32_t crc32c(const void* data, size_t size);
uint32_t masked_crc32c(const void* data, size_t size);

class TensorBoardWriter {
 public:
  // Creates `dir` and a new events file in it, named as TensorBoard expects
  // (events.out.tfevents.<seconds>.<host>.<pid>), and writes the version event.
  explicit TensorBoardWriter(const std::filesystem::path& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One scalar at a step; wall_time in seconds since the epoch (now if < 0).
  void add_scalar(const std::string& tag, int64_t step, double value, double wall_time = -1);
  // Makes what was written visible to a reader (and durable on a crash).
  void flush();
  const std::filesystem::path& path() const { return path_; }

 private:
  void write_record(const std::string& payload);

  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
};

// What a reader finds in an events file (tests and `roformer plot`).
struct TensorBoardScalar {
  std::string tag;
  int64_t step = 0;
  double wall_time = 0;
  float value = 0;
};
struct TensorBoardEvents {
  std::string file_version;  // "brain.Event:2"
  std::vector<TensorBoardScalar> scalars;
};
// Reads every record, checking both CRCs of each; throws InputError naming
// the file and the byte offset of the first bad record.
TensorBoardEvents read_tensorboard_events(const std::filesystem::path& path);

}  // namespace roformer
