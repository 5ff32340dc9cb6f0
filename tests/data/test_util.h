// Helpers shared by the data tests: a temporary directory, the committed
// vocab and corpus excerpt, small files.
#pragma once

#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>

#include "data/vocab.h"

namespace roformer::data::testing {

inline const std::string kFixtures = ROFORMER_FIXTURES_DIR;
inline const std::string kBertVocab = kFixtures + "/bert-base-uncased-vocab.txt";
inline const std::string kCorpus = kFixtures + "/corpus";

inline std::shared_ptr<const Vocab> bert_vocab() {
  static auto v = std::make_shared<const Vocab>(Vocab::load(kBertVocab));
  return v;
}

// A fresh directory under the system temp dir, removed with its content.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("roformer-data-test-" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline void write_file(const std::string& path, const std::string& content) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
}

}  // namespace roformer::data::testing
