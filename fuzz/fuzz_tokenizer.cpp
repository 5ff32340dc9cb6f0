// The WordPiece tokenizer on any bytes (invalid UTF-8 included), with and
// without lowercasing, and the decoder on what it produced.
#include "data/tokenizer.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const roformer::data::Tokenizer lower(ROFORMER_FUZZ_VOCAB);
  static const roformer::data::Tokenizer cased = [] {
    roformer::data::TokenizerOptions o;
    o.lowercase = false;
    return roformer::data::Tokenizer(ROFORMER_FUZZ_VOCAB, o);
  }();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (const auto* tok : {&lower, &cased}) {
    roformer::fuzz::expect_error_or_success([&] {
      const auto ids = tok->encode_ids(text);
      for (int32_t id : ids)
        if (id < 0 || id >= tok->vocab().size()) std::abort();
      const auto enc = tok->encode(text, text, 32);
      if (enc.input_ids.size() > 32) std::abort();
      (void)tok->decode(ids);
    });
  }
  return 0;
}
