// Checks a command runs before it builds anything, so bad input fails in a
// moment with the key to blame: the memory the model and batch need
// (train/memory_estimate.h), a run directory that can be written, a
// vocabulary that fits the model.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "train/config.h"

namespace roformer {

// pretrain: run.dir writable, data.vocab against model.vocab_size (padding
// warned about when large), memory for every stage (per rank of `world_size`).
void preflight_pretrain(const Config& config, int64_t world_size = 1);
// finetune: run.dir writable, memory for the finetune section (per rank).
void preflight_finetune(const Config& config, int64_t world_size = 1);
// convert --from-hf DIR: config.json's model fits in memory, and vocab.txt
// is not empty and covers the embedding rows.
void preflight_convert_from_hf(const std::filesystem::path& dir);

// Creates `dir` (and parents) or throws InputError naming `key`, the path and
// the reason ("run.dir: cannot create directory '/proc/x': ...").
void require_writable_dir(const std::filesystem::path& dir, const std::string& key);

}  // namespace roformer
