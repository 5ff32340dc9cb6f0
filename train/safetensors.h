// Hugging Face safetensors files: an 8-byte little-endian header length, a
// JSON header {"name": {"dtype", "shape", "data_offsets": [begin, end]}, ...,
// "__metadata__": {string: string}} and the raw little-endian tensor bytes.
// The reader memory-maps the file and checks every entry (dtype known, offsets
// inside the data section, byte count == shape x element size, no overlaps)
// before any tensor is read; tensors are converted straight from the mapping
// into f32 tensors. The writer writes F32 through a temporary file + rename.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "layers/module.h"

namespace roformer {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // "F32", "F16", "BF16", ... (as written in the header)
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte offsets relative to the data section
};

class SafetensorsFile {
 public:
  // Maps `path` and validates its header. Throws InputError naming the file.
  explicit SafetensorsFile(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // Entries in header order (the order of their data offsets).
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const SafetensorsEntry* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The tensor as f32 (F32, F16 and BF16 are supported; anything else throws
  // InputError naming the tensor and its dtype).
  Tensor read_f32(const std::string& name) const;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  const uint8_t* map_ = nullptr;
  size_t size_ = 0;
  const uint8_t* data_ = nullptr;  // start of the data section
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Writes `tensors` (any floating dtype, stored as F32) in the given order,
// atomically (temporary file in the same folder, then rename). Names must be
// unique. Throws Error on I/O failure.
void write_safetensors(const std::filesystem::path& path, const StateDict& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace roformer
