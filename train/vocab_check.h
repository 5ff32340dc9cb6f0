// A vocabulary file against the model's embedding rows. model.vocab_size may
// exceed the file's token count: padding the embedding to a multiple of 64 is
// a legitimate speed trick (MosaicBERT pads 30,522 to 30,528). Those padding
// rows have no token, so they are never predicted (see train/predict.cpp).
#pragma once

#include <cstdint>
#include <string>

namespace roformer {

// Padding beyond this many rows is unusual enough to mention (or refuse).
inline constexpr int64_t kVocabPaddingSlack = 128;

enum class VocabExcess {
  kWarn,    // a config the user wrote: warn when the padding is large
  kRefuse,  // an imported model (convert): its vocab.txt must cover the rows
};

// Throws InputError naming `vocab_path` and `model_key` when the file is empty
// or has more tokens than the model has rows; handles a large excess of rows
// per `excess`.
void check_vocab_fits_model(int64_t vocab_tokens, int64_t model_vocab_size,
                            const std::string& vocab_path, const std::string& model_key,
                            VocabExcess excess);

}  // namespace roformer
