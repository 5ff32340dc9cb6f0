#include "data/tokenizer.h"

#include <utf8proc.h>

#include <array>
#include <cstring>

#include "core/error.h"
#include "data/utf8.h"

namespace roformer::data {
namespace {

// --- character classes (BERT's definitions) ----------------------------------

enum AsciiClass : uint8_t { kAsciiKeep, kAsciiDrop, kAsciiSpace, kAsciiPunct };

constexpr std::array<uint8_t, 128> make_ascii_table() {
  std::array<uint8_t, 128> t{};
  for (int c = 0; c < 128; ++c) {
    uint8_t k = kAsciiKeep;
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r')
      k = kAsciiSpace;
    else if (c < 32 || c == 127)  // control characters (Cc); NUL too
      k = kAsciiDrop;
    else if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) ||
             (c >= 123 && c <= 126))
      k = kAsciiPunct;
    t[size_t(c)] = k;
  }
  return t;
}
constexpr std::array<uint8_t, 128> kAscii = make_ascii_table();

inline int category(char32_t cp) {
  return utf8proc_category(utf8proc_int32_t(cp));
}

inline bool is_punctuation(char32_t cp) {
  if (cp < 128) return kAscii[cp] == kAsciiPunct;
  const int c = category(cp);
  return c >= UTF8PROC_CATEGORY_PC && c <= UTF8PROC_CATEGORY_PO;
}

// Category C* (Cc, Cf, Cs, Co and unassigned Cn) except tab, LF, CR.
inline bool is_control(char32_t cp) {
  if (cp == '\t' || cp == '\n' || cp == '\r') return false;
  const int c = category(cp);
  return c == UTF8PROC_CATEGORY_CN || c >= UTF8PROC_CATEGORY_CC;
}

inline bool is_whitespace(char32_t cp) {
  if (cp == ' ' || cp == '\t' || cp == '\n' || cp == '\r') return true;
  return category(cp) == UTF8PROC_CATEGORY_ZS;
}

// The CJK blocks of BERT's _is_chinese_char (not Hangul, Hiragana, Katakana).
inline bool is_cjk(char32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) ||
         (cp >= 0x20000 && cp <= 0x2A6DF) || (cp >= 0x2A700 && cp <= 0x2B73F) ||
         (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B820 && cp <= 0x2CEAF) ||
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

// Characters that NFC/NFD leave alone and that never compose with what
// follows: below U+0300 (NFC) or U+00C0 (NFD), and the general punctuation
// of English text (dashes, curly quotes, ellipsis), so the normalisers are
// only called for text that needs them.
inline bool general_punctuation(char32_t cp) {
  return (cp >= 0x2010 && cp <= 0x2027) || (cp >= 0x2030 && cp <= 0x205E);
}
inline bool nfc_inert(char32_t cp) {
  return cp < 0x300 || general_punctuation(cp);
}
inline bool nfd_inert(char32_t cp) {
  return cp < 0xC0 || general_punctuation(cp);
}

// After clean-up, the only characters Python's str.split() still splits on
// besides the space are the line and paragraph separators (Zl, Zp).
inline bool is_separator(char32_t cp) {
  return cp == ' ' || cp == 0x2028 || cp == 0x2029;
}

// Full lower-case mapping of one character, as Python's str.lower() gives it
// for a lone character: U+0130 is the only unconditional multi-character case.
inline void append_lower(std::u32string& out, char32_t cp) {
  if (cp < 128) {
    out.push_back(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp);
  } else if (cp == 0x130) {
    out.push_back(0x69);
    out.push_back(0x307);
  } else {
    out.push_back(char32_t(utf8proc_tolower(utf8proc_int32_t(cp))));
  }
}

struct Scratch {
  std::u32string cps, tmp, token;
  std::string utf8, word, piece, utf8_word, out_piece, lowered;
  std::vector<std::string_view> segments;
  std::vector<utf8proc_int32_t> norm;
  std::vector<uint32_t> bounds;
  std::vector<int32_t> pieces;
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// Canonical normalisation of `cps` in place (NFC with compose=true, else NFD).
void normalize(std::u32string& cps, bool compose, Scratch& s) {
  s.utf8.clear();
  for (char32_t cp : cps) append_utf8(s.utf8, cp);
  const auto options =
      utf8proc_option_t(UTF8PROC_STABLE | (compose ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE));
  if (s.norm.size() < s.utf8.size() + 16) s.norm.resize(s.utf8.size() + 16);
  utf8proc_ssize_t n;
  for (;;) {
    n = utf8proc_decompose(reinterpret_cast<const utf8proc_uint8_t*>(s.utf8.data()),
                           utf8proc_ssize_t(s.utf8.size()), s.norm.data(),
                           utf8proc_ssize_t(s.norm.size()), options);
    RF_CHECK(n >= 0, "utf8proc_decompose failed: ", utf8proc_errmsg(n));
    if (size_t(n) <= s.norm.size()) break;
    s.norm.resize(size_t(n));
  }
  n = utf8proc_normalize_utf32(s.norm.data(), n, options);
  RF_CHECK(n >= 0, "utf8proc_normalize_utf32 failed: ", utf8proc_errmsg(n));
  cps.assign(s.norm.begin(), s.norm.begin() + n);
}

bool is_special_token(std::string_view word) {
  for (auto special : kSpecialTokens)
    if (word == special) return true;
  return false;
}

void to_utf8(std::u32string_view cps, std::string& out) {
  out.clear();
  for (char32_t cp : cps) append_utf8(out, cp);
}

// Python's per-character str.lower() of the whole text, as
// PreTrainedTokenizer.tokenize applies it before RoFormer's jieba.
void lower_text(std::string_view text, std::string& out) {
  out.clear();
  std::u32string one;
  for (size_t pos = 0; pos < text.size();) {
    const auto c = static_cast<unsigned char>(text[pos]);
    if (c < 0x80) {
      out.push_back(c >= 'A' && c <= 'Z' ? char(c + 32) : char(c));
      ++pos;
      continue;
    }
    char32_t cp;
    const size_t n = decode_utf8(text, pos, cp);
    if (cp >= 0x3000 && cp < 0xA000) {  // CJK, kana, CJK punctuation: no case
      out.append(text.substr(pos, n));
    } else {
      one.clear();
      append_lower(one, cp);
      for (char32_t l : one) append_utf8(out, l);
    }
    pos += n;
  }
}

}  // namespace

PreTokenizer parse_pre_tokenizer(std::string_view name) {
  if (name == "none") return PreTokenizer::none;
  if (name == "jieba") return PreTokenizer::jieba;
  throw InputError(detail::concat("unknown pre-tokenizer '", name, "' (none | jieba)"));
}

std::string_view pre_tokenizer_name(PreTokenizer p) {
  return p == PreTokenizer::jieba ? "jieba" : "none";
}

std::string TokenizerIdentity::describe() const {
  return detail::concat("vocab ", vocab_hash, " (", vocab_size, " pieces), lowercase=", lowercase,
                        ", strip_accents=", strip_accents,
                        ", tokenize_chinese_chars=", tokenize_chinese_chars);
}

Tokenizer::Tokenizer(std::shared_ptr<const Vocab> vocab, TokenizerOptions options)
    : vocab_(std::move(vocab)), options_(options) {
  RF_CHECK(vocab_ != nullptr, "Tokenizer needs a vocab");
  RF_INPUT_CHECK(options_.max_input_chars_per_word > 0, "max_input_chars_per_word must be > 0");
  if (options_.pre_tokenizer == PreTokenizer::jieba)
    jieba_ =
        Jieba::load(options_.jieba_dict.empty() ? Jieba::default_dict_path() : options_.jieba_dict);
}

Tokenizer::Tokenizer(const std::string& vocab_path, TokenizerOptions options)
    : Tokenizer(std::make_shared<const Vocab>(Vocab::load(vocab_path)), options) {}

TokenizerIdentity Tokenizer::identity() const {
  return {vocab_->hash(), vocab_->size(), options_.lowercase, options_.strips_accents(),
          options_.tokenize_chinese_chars};
}

std::string Tokenizer::pre_tokenizer_identity() const {
  return jieba_ ? "jieba (dict " + jieba_->hash() + ")" : "none";
}

// Calls emit(segment, is_special) for the text between special tokens and
// for each special token, as transformers' added-token trie splits it.
template <class Emit>
void Tokenizer::split_specials(std::string_view text, Emit&& emit) const {
  size_t start = 0, pos = 0;
  while ((pos = text.find('[', pos)) != std::string_view::npos) {
    std::string_view hit;
    for (auto special : kSpecialTokens)
      if (text.compare(pos, special.size(), special) == 0) hit = special;
    if (hit.empty()) {
      ++pos;
      continue;
    }
    if (pos > start) emit(text.substr(start, pos - start), false);
    emit(hit, true);
    pos += hit.size();
    start = pos;
  }
  if (start < text.size()) emit(text.substr(start), false);
}

// BERT's BasicTokenizer on a text without special tokens: emit(word) per word.
// The text is cut at ASCII whitespace first: nothing in the pipeline joins
// characters across a space (clean-up and case mapping are per character, NFC
// never composes with a space), so each chunk can be handled on its own, and
// the ASCII chunks of mostly-English text take the fast path even when the
// text has a curly quote somewhere.
template <class Emit>
void Tokenizer::basic_words(std::string_view segment, Emit&& emit) const {
  const size_t n = segment.size();
  size_t i = 0;
  while (i < n) {
    while (i < n && kAscii[static_cast<unsigned char>(segment[i]) & 0x7F] == kAsciiSpace &&
           static_cast<unsigned char>(segment[i]) < 0x80)
      ++i;
    size_t j = i;
    while (j < n && !(static_cast<unsigned char>(segment[j]) < 0x80 &&
                      kAscii[static_cast<unsigned char>(segment[j])] == kAsciiSpace))
      ++j;
    if (j > i) basic_chunk(segment.substr(i, j - i), emit);
    i = j;
  }
}

template <class Emit>
void Tokenizer::basic_chunk(std::string_view segment, Emit&& emit) const {
  Scratch& s = scratch();
  const bool lower = options_.lowercase;
  const bool strip = options_.strips_accents();

  // Splits one whitespace-delimited token on punctuation.
  auto split_punct_ascii = [&](std::string_view token) {
    if (is_special_token(token)) {  // never_split (can only arise after clean-up)
      emit(token);
      return;
    }
    size_t begin = 0;
    for (size_t i = 0; i < token.size(); ++i) {
      if (kAscii[static_cast<unsigned char>(token[i])] == kAsciiPunct) {
        if (i > begin) emit(token.substr(begin, i - begin));
        emit(token.substr(i, 1));
        begin = i + 1;
      }
    }
    if (begin < token.size()) emit(token.substr(begin));
  };

  if (is_ascii(segment)) {
    // Fast path: no normalisation can change ASCII text.
    std::string& token = s.word;
    token.clear();
    for (unsigned char c : segment) {
      switch (kAscii[c]) {
        case kAsciiDrop:
          break;
        case kAsciiSpace:
          if (!token.empty()) {
            split_punct_ascii(token);
            token.clear();
          }
          break;
        default:
          token.push_back(lower && c >= 'A' && c <= 'Z' ? char(c + 32) : char(c));
      }
    }
    if (!token.empty()) split_punct_ascii(token);
    return;
  }

  // General path on code points.
  std::u32string& cps = s.cps;
  cps.clear();
  for (size_t pos = 0; pos < segment.size();) {
    char32_t cp;
    pos += decode_utf8(segment, pos, cp);
    // Lower-case first, character by character (PreTrainedTokenizer.tokenize).
    if (lower)
      append_lower(cps, cp);
    else
      cps.push_back(cp);
  }
  // Clean-up and CJK spacing.
  std::u32string& clean = s.tmp;
  clean.clear();
  bool needs_nfc = false;
  for (char32_t cp : cps) {
    if (cp == 0 || cp == 0xFFFD || is_control(cp)) continue;
    if (is_whitespace(cp)) {
      clean.push_back(' ');
    } else if (options_.tokenize_chinese_chars && is_cjk(cp)) {
      clean.push_back(' ');
      clean.push_back(cp);
      clean.push_back(' ');
      needs_nfc |= cp >= 0xF900;  // compatibility ideographs map to unified ones
    } else {
      clean.push_back(cp);
      needs_nfc |= !nfc_inert(cp);
    }
  }
  if (needs_nfc) normalize(clean, /*compose=*/true, s);

  std::u32string& token = s.token;
  std::string& utf8_word = s.utf8_word;
  auto process = [&](std::u32string_view raw) {
    to_utf8(raw, utf8_word);
    if (is_special_token(utf8_word)) {
      emit(std::string_view(utf8_word));
      return;
    }
    token.clear();
    if (lower)
      for (char32_t cp : raw) append_lower(token, cp);
    else
      token.assign(raw);
    if (strip) {
      bool any = false;
      for (char32_t cp : token) any |= !nfd_inert(cp);
      if (any) {
        normalize(token, /*compose=*/false, s);
        size_t w = 0;
        for (char32_t cp : token)
          if (category(cp) != UTF8PROC_CATEGORY_MN) token[w++] = cp;
        token.resize(w);
      }
    }
    size_t begin = 0;
    std::string& piece = s.out_piece;
    for (size_t i = 0; i < token.size(); ++i) {
      if (is_punctuation(token[i])) {
        if (i > begin) {
          to_utf8(std::u32string_view(token).substr(begin, i - begin), piece);
          emit(std::string_view(piece));
        }
        to_utf8(std::u32string_view(token).substr(i, 1), piece);
        emit(std::string_view(piece));
        begin = i + 1;
      }
    }
    if (begin < token.size()) {
      to_utf8(std::u32string_view(token).substr(begin), piece);
      emit(std::string_view(piece));
    }
  };
  size_t begin = 0;
  for (size_t i = 0; i <= clean.size(); ++i) {
    if (i == clean.size() || is_separator(clean[i])) {
      if (i > begin) process(std::u32string_view(clean).substr(begin, i - begin));
      begin = i + 1;
    }
  }
}

void Tokenizer::wordpiece(std::string_view word, std::vector<int32_t>& out) const {
  Scratch& s = scratch();
  // Code point boundaries: the limit and the candidate ends are in characters.
  auto& bounds = s.bounds;
  bounds.clear();
  for (size_t i = 0; i < word.size(); ++i)
    if ((static_cast<unsigned char>(word[i]) & 0xC0) != 0x80) bounds.push_back(uint32_t(i));
  const size_t n = bounds.size();
  bounds.push_back(uint32_t(word.size()));
  const int32_t unk = vocab_->special().unk;
  if (n > size_t(options_.max_input_chars_per_word)) {
    out.push_back(unk);
    return;
  }
  const size_t max_bytes = vocab_->max_piece_bytes();
  auto& pieces = s.pieces;
  pieces.clear();
  std::string& cand = s.piece;
  size_t start = 0;
  while (start < n) {
    // cand = ("##" if not first) + rest of the word; candidates are its prefixes.
    cand.assign(start > 0 ? "##" : "");
    const size_t prefix = cand.size();
    cand.append(word.substr(bounds[start]));
    int32_t found = -1;
    size_t end = n;
    for (; end > start; --end) {
      const size_t len = bounds[end] - bounds[start];
      if (len > max_bytes) continue;
      found = vocab_->find(std::string_view(cand).substr(0, prefix + len));
      if (found >= 0) break;
    }
    if (found < 0) {
      out.push_back(unk);
      return;
    }
    pieces.push_back(found);
    start = end;
  }
  out.insert(out.end(), pieces.begin(), pieces.end());
}

void Tokenizer::jieba_segments(std::string_view text, std::vector<std::string_view>& out) const {
  Scratch& s = scratch();
  if (options_.lowercase) {
    lower_text(text, s.lowered);
    text = s.lowered;
  }
  out.clear();
  jieba_->cut(text, out);
}

void Tokenizer::encode_jieba(std::string_view text, std::vector<int32_t>& out) const {
  // The segments view scratch().lowered, which basic_words leaves alone.
  std::vector<std::string_view>& segments = scratch().segments;
  jieba_segments(text, segments);
  for (std::string_view segment : segments) {
    const int32_t id = vocab_->find(segment);
    if (id >= 0)
      out.push_back(id);
    else
      basic_words(segment, [&](std::string_view word) { wordpiece(word, out); });
  }
}

void Tokenizer::encode_ids(std::string_view text, std::vector<int32_t>& out) const {
  split_specials(text, [&](std::string_view segment, bool special) {
    if (special)
      out.push_back(vocab_->find(segment));
    else if (jieba_)
      encode_jieba(segment, out);
    else
      basic_words(segment, [&](std::string_view word) { wordpiece(word, out); });
  });
}

std::vector<std::string> Tokenizer::pre_tokenize(std::string_view text) const {
  std::vector<std::string> out;
  std::vector<std::string_view> segments;
  split_specials(text, [&](std::string_view segment, bool special) {
    if (special || !jieba_) {
      out.emplace_back(segment);
      return;
    }
    jieba_segments(segment, segments);
    for (std::string_view w : segments) {
      bool blank = true;
      for (size_t pos = 0; pos < w.size() && blank;) {
        char32_t cp;
        pos += decode_utf8(w, pos, cp);
        blank = is_whitespace(cp);
      }
      if (!blank) out.emplace_back(w);
    }
  });
  return out;
}

std::vector<int32_t> Tokenizer::encode_ids(std::string_view text) const {
  std::vector<int32_t> out;
  encode_ids(text, out);
  return out;
}

std::vector<std::string> Tokenizer::tokenize(std::string_view text) const {
  std::vector<std::string> out;
  for (int32_t id : encode_ids(text)) out.push_back(vocab_->token(id));
  return out;
}

std::vector<std::string> Tokenizer::basic_tokenize(std::string_view text) const {
  std::vector<std::string> out;
  split_specials(text, [&](std::string_view segment, bool special) {
    if (special)
      out.emplace_back(segment);
    else
      basic_words(segment, [&](std::string_view word) { out.emplace_back(word); });
  });
  return out;
}

Encoding Tokenizer::encode(std::string_view text, std::optional<std::string_view> pair,
                           int64_t max_length) const {
  std::vector<int32_t> a = encode_ids(text), b;
  if (pair) b = encode_ids(*pair);
  const int64_t extra = pair ? 3 : 2;
  if (max_length > 0) {
    RF_INPUT_CHECK(max_length >= extra, "max_length ", max_length, " cannot hold the ", extra,
                   " special tokens");
    int64_t remove = int64_t(a.size() + b.size()) + extra - max_length;
    // Longest first, one token at a time; ties take from the second text.
    while (remove-- > 0) {
      if (!pair || a.size() > b.size())
        a.pop_back();
      else
        b.pop_back();
    }
  }
  const auto& sp = vocab_->special();
  Encoding e;
  e.input_ids.reserve(a.size() + b.size() + size_t(extra));
  e.input_ids.push_back(sp.cls);
  e.input_ids.insert(e.input_ids.end(), a.begin(), a.end());
  e.input_ids.push_back(sp.sep);
  e.token_type_ids.assign(e.input_ids.size(), 0);
  if (pair) {
    e.input_ids.insert(e.input_ids.end(), b.begin(), b.end());
    e.input_ids.push_back(sp.sep);
    e.token_type_ids.resize(e.input_ids.size(), 1);
  }
  return e;
}

namespace {
void replace_all(std::string& s, std::string_view from, std::string_view to) {
  size_t pos = 0;
  while ((pos = s.find(from, pos)) != std::string::npos) {
    s.replace(pos, from.size(), to);
    pos += to.size();
  }
}
}  // namespace

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens,
                              bool clean_up_spaces) const {
  // Runs of ordinary pieces are joined ("a ##b" -> "ab"); special tokens stand
  // apart, as transformers' _decode groups them.
  std::vector<std::string> parts;
  std::string run;
  bool in_run = false;
  auto flush = [&] {
    if (!in_run) return;
    replace_all(run, " ##", "");
    // strip() of the joined run
    const size_t b = run.find_first_not_of(' ');
    parts.push_back(b == std::string::npos ? std::string() : run.substr(b));
    run.clear();
    in_run = false;
  };
  for (int32_t id : ids) {
    const bool special = vocab_->is_special(id);
    if (special && skip_special_tokens) continue;
    const std::string& t =
        id >= 0 && id < vocab_->size() ? vocab_->token(id) : vocab_->token(vocab_->special().unk);
    if (special) {
      flush();
      parts.push_back(t);
    } else {
      if (in_run) run.push_back(' ');
      run += t;
      in_run = true;
    }
  }
  flush();
  std::string text;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) text.push_back(' ');
    text += parts[i];
  }
  if (clean_up_spaces) {
    static constexpr std::pair<std::string_view, std::string_view> kRules[] = {
        {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
        {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
    for (auto [from, to] : kRules) replace_all(text, from, to);
  }
  return text;
}

}  // namespace roformer::data
