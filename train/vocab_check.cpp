#include "train/vocab_check.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/error.h"

namespace roformer {

void check_vocab_fits_model(int64_t vocab_tokens, int64_t model_vocab_size,
                            const std::string& vocab_path, const std::string& model_key,
                            VocabExcess excess) {
  if (vocab_tokens <= 0) throw InputError(fmt::format("vocab file '{}' is empty", vocab_path));
  if (vocab_tokens > model_vocab_size)
    throw InputError(fmt::format(
        "vocab file '{}' has {} tokens but {} is {}: ids from {} on have no embedding row",
        vocab_path, vocab_tokens, model_key, model_vocab_size, model_vocab_size));
  const int64_t padding = model_vocab_size - vocab_tokens;
  if (padding < kVocabPaddingSlack) return;
  const std::string what = fmt::format(
      "{} is {} but vocab file '{}' has only {} tokens: {} embedding rows have no token (padding "
      "to a multiple of 64 needs fewer than 64)",
      model_key, model_vocab_size, vocab_path, vocab_tokens, padding);
  if (excess == VocabExcess::kRefuse)
    throw InputError(what + "; the vocab file is too short for this model");
  spdlog::warn("{}; those rows are never predicted", what);
}

}  // namespace roformer
