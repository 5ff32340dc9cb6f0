#include "data/utf8.h"

#include <utf8proc.h>

namespace roformer::data {

size_t decode_utf8(std::string_view text, size_t pos, char32_t& cp) {
  const auto c = static_cast<unsigned char>(text[pos]);
  if (c < 0x80) {
    cp = c;
    return 1;
  }
  utf8proc_int32_t value = -1;
  const utf8proc_ssize_t n =
      utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + pos),
                       utf8proc_ssize_t(text.size() - pos), &value);
  if (n <= 0 || value < 0) {
    cp = 0xFFFD;
    return 1;
  }
  cp = char32_t(value);
  return size_t(n);
}

std::optional<size_t> find_invalid_utf8(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    const auto c = static_cast<unsigned char>(text[pos]);
    if (c < 0x80) {
      ++pos;
      continue;
    }
    utf8proc_int32_t value = -1;
    const utf8proc_ssize_t n =
        utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + pos),
                         utf8proc_ssize_t(text.size() - pos), &value);
    if (n <= 0 || value < 0) return pos;
    pos += size_t(n);
  }
  return std::nullopt;
}

std::string replace_invalid_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    char32_t cp;
    const size_t n = decode_utf8(text, pos, cp);
    if (cp == 0xFFFD && n == 1 && static_cast<unsigned char>(text[pos]) >= 0x80)
      append_utf8(out, 0xFFFD);
    else
      out.append(text.substr(pos, n));
    pos += n;
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

}  // namespace roformer::data
