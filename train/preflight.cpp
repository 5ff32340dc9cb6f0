#include "train/preflight.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/file_checks.h"
#include "data/vocab.h"
#include "layers/model_config.h"
#include "train/memory_estimate.h"
#include "train/vocab_check.h"

namespace roformer {

namespace fs = std::filesystem;

void require_writable_dir(const fs::path& dir, const std::string& key) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw InputError(
        fmt::format("{}: cannot create directory '{}': {}", key, dir.string(), ec.message()));
  if (!fs::is_directory(dir, ec))
    throw InputError(fmt::format("{}: '{}' is not a directory", key, dir.string()));
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    throw InputError(fmt::format("{}: cannot write in directory '{}': {}", key, dir.string(),
                                 std::strerror(errno)));
}

void preflight_pretrain(const Config& config, int64_t world_size) {
  check_memory_for_pretraining(config, world_size);
  if (!config.data.vocab.empty()) {
    const data::Vocab vocab = data::Vocab::load(config.data.vocab);
    check_vocab_fits_model(vocab.size(), config.model.vocab_size, config.data.vocab,
                           "model.vocab_size", VocabExcess::kWarn);
  }
  if (!config.run.dir.empty()) require_writable_dir(config.run.dir, "run.dir");
}

void preflight_finetune(const Config& config, int64_t world_size) {
  check_memory_for_finetuning(config, world_size);
  if (!config.run.dir.empty()) require_writable_dir(config.run.dir, "run.dir");
}

void preflight_convert_from_hf(const fs::path& dir) {
  const fs::path config_path = dir / "config.json", vocab_path = dir / "vocab.txt";
  std::error_code ec;
  if (!fs::is_regular_file(config_path, ec) || !fs::is_regular_file(vocab_path, ec))
    return;  // read_hf_folder names what is missing
  std::ifstream in(config_path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    throw InputError(config_path.string() + ": not valid JSON: " + e.what());
  }
  const ModelConfig model = from_hf_config_json(json, config_path.string());
  check_memory_for_model(model, MemoryUse::kConvert, config_path.string(),
                         config_path.string() + ": ");
  const data::Vocab vocab = data::Vocab::load(vocab_path.string());
  check_vocab_fits_model(vocab.size(), model.vocab_size, vocab_path.string(),
                         config_path.string() + ": vocab_size", VocabExcess::kRefuse);
}

}  // namespace roformer
