// UTF-8 helpers: validation with byte offsets, replacement of invalid
// sequences, decoding and encoding. Decoding itself is utf8proc's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace roformer::data {

// Byte offset of the first invalid UTF-8 sequence in `text` (overlong forms,
// surrogates and code points above U+10FFFF count as invalid), or nullopt.
std::optional<size_t> find_invalid_utf8(std::string_view text);

// `text` with every invalid sequence replaced by U+FFFD (one per bad byte
// sequence that utf8proc rejects, as Python's errors="replace" does for
// a single bad byte).
std::string replace_invalid_utf8(std::string_view text);

// Decodes the code point starting at text[pos]; returns its byte length and
// stores the code point, or returns 1 and stores U+FFFD for an invalid byte.
size_t decode_utf8(std::string_view text, size_t pos, char32_t& cp);

// Appends the UTF-8 encoding of `cp`.
void append_utf8(std::string& out, char32_t cp);

inline bool is_ascii(std::string_view text) {
  for (unsigned char c : text)
    if (c >= 0x80) return false;
  return true;
}

}  // namespace roformer::data
