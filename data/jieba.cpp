#include "data/jieba.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>

#include "core/error.h"
#include "data/hash.h"
#include "data/utf8.h"

namespace roformer::data {
namespace {

constexpr uint64_t kEmpty = ~uint64_t(0);
constexpr const char* kDebianDict = "/usr/lib/python3/dist-packages/jieba/dict.txt";

inline uint64_t trie_key(int32_t node, char32_t cp) {
  return (uint64_t(uint32_t(node)) << 21) | uint64_t(cp);
}
inline size_t slot_of(uint64_t key, size_t mask) {
  return size_t((key * 0x9E3779B97F4A7C15ull) >> 20) & mask;
}
inline bool is_eng(char32_t cp) {
  return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= '0' && cp <= '9');
}
// Python's bytes.strip(): ASCII whitespace.
inline bool is_ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

struct Scratch {
  std::vector<char32_t> cps;
  std::vector<uint32_t> offsets;
  std::vector<double> route_score;
  std::vector<int32_t> route_end;
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

}  // namespace

int32_t Jieba::child(int32_t node, char32_t cp) const {
  const uint64_t key = trie_key(node, cp);
  const size_t mask = keys_.size() - 1;
  for (size_t i = slot_of(key, mask);; i = (i + 1) & mask) {
    if (keys_[i] == key) return values_[i];
    if (keys_[i] == kEmpty) return -1;
  }
}

void Jieba::grow() {
  std::vector<uint64_t> keys(std::max<size_t>(1024, keys_.size() * 2), kEmpty);
  std::vector<int32_t> values(keys.size(), -1);
  const size_t mask = keys.size() - 1;
  for (size_t j = 0; j < keys_.size(); ++j) {
    if (keys_[j] == kEmpty) continue;
    size_t i = slot_of(keys_[j], mask);
    while (keys[i] != kEmpty) i = (i + 1) & mask;
    keys[i] = keys_[j];
    values[i] = values_[j];
  }
  keys_.swap(keys);
  values_.swap(values);
}

int32_t Jieba::add_child(int32_t node, char32_t cp) {
  if ((used_ + 1) * 2 > keys_.size()) grow();
  const uint64_t key = trie_key(node, cp);
  const size_t mask = keys_.size() - 1;
  size_t i = slot_of(key, mask);
  for (; keys_[i] != kEmpty; i = (i + 1) & mask)
    if (keys_[i] == key) return values_[i];
  keys_[i] = key;
  values_[i] = int32_t(score_.size());
  score_.push_back(std::numeric_limits<double>::quiet_NaN());
  ++used_;
  return values_[i];
}

Jieba Jieba::from_text(std::string_view text, std::string source) {
  Jieba j;
  j.source_ = std::move(source);
  j.hash_ = Fnv1a64().update(text).hex();
  j.score_.push_back(std::numeric_limits<double>::quiet_NaN());  // root
  j.grow();
  // Frequencies first (the last line of a repeated word wins, every line
  // counts towards the total, as jieba's gen_pfdict does); logs at the end.
  std::vector<int64_t> freq(1, 0);
  int64_t total = 0;
  size_t pos = 0;
  int64_t line_no = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    while (!line.empty() && is_ascii_space(line.front())) line.remove_prefix(1);
    while (!line.empty() && is_ascii_space(line.back())) line.remove_suffix(1);
    auto bad = [&](const char* why) {
      return InputError(detail::concat(j.source_, ":", line_no, ": ", why,
                                       " (a jieba dict.txt "
                                       "line is 'word frequency [tag]'): '",
                                       line, "'"));
    };
    const size_t space = line.find(' ');
    if (space == std::string_view::npos || space == 0) throw bad("no word and frequency");
    const std::string_view word = line.substr(0, space);
    std::string_view number = line.substr(space + 1);
    number = number.substr(0, number.find(' '));
    int64_t f = 0;
    if (number.empty()) throw bad("no frequency");
    for (char c : number) {
      if (c < '0' || c > '9') throw bad("the frequency is not a non-negative integer");
      f = f * 10 + (c - '0');
      if (f > (int64_t(1) << 52)) throw bad("the frequency is too large");
    }
    if (find_invalid_utf8(word)) throw bad("invalid UTF-8 in the word");
    int32_t node = 0;
    for (size_t p = 0; p < word.size();) {
      char32_t cp;
      p += decode_utf8(word, p, cp);
      node = j.add_child(node, cp);
    }
    if (freq.size() < j.score_.size()) freq.resize(j.score_.size(), 0);
    freq[size_t(node)] = f;
    total += f;
    ++j.words_;
  }
  RF_INPUT_CHECK(total > 0, j.source_, ": the dictionary holds no word with a positive frequency");
  freq.resize(j.score_.size(), 0);
  const double log_total = std::log(double(total));
  for (size_t n = 1; n < freq.size(); ++n)
    if (freq[n] > 0) j.score_[n] = std::log(double(freq[n])) - log_total;
  j.unknown_score_ = std::log(1.0) - log_total;
  return j;
}

std::shared_ptr<const Jieba> Jieba::load(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  RF_INPUT_CHECK(fs::is_regular_file(path, ec), "jieba dictionary '", path,
                 "' does not exist (Debian's python3-jieba ships one at ", kDebianDict, ")");
  // Same path, size and time: the same dictionary.
  const std::string key = detail::concat(path, "|", fs::file_size(path, ec), "|",
                                         fs::last_write_time(path, ec).time_since_epoch().count());
  static std::mutex mutex;
  static std::map<std::string, std::shared_ptr<const Jieba>> cache;
  std::lock_guard lock(mutex);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  std::ifstream in(path, std::ios::binary);
  RF_INPUT_CHECK(in, "cannot read jieba dictionary '", path, "'");
  std::stringstream buffer;
  buffer << in.rdbuf();
  auto jieba = std::make_shared<const Jieba>(from_text(buffer.str(), path));
  cache.emplace(key, jieba);
  return jieba;
}

std::string Jieba::default_dict_path() {
  if (const char* env = std::getenv("ROFORMER_JIEBA_DICT"); env && *env) return env;
  std::error_code ec;
  RF_INPUT_CHECK(std::filesystem::is_regular_file(kDebianDict, ec),
                 "no jieba dictionary: install Debian's python3-jieba (scripts/setup.sh does), "
                 "or set data.jieba_dict or $ROFORMER_JIEBA_DICT to a jieba dict.txt");
  return kDebianDict;
}

void Jieba::cut(std::string_view text, std::vector<std::string_view>& out) const {
  Scratch& s = scratch();
  s.cps.clear();
  s.offsets.clear();
  for (size_t pos = 0; pos < text.size();) {
    char32_t cp;
    s.offsets.push_back(uint32_t(pos));
    pos += decode_utf8(text, pos, cp);
    s.cps.push_back(cp);
  }
  const size_t n = s.cps.size();
  s.offsets.push_back(uint32_t(text.size()));
  const char32_t* cps = s.cps.data();
  const uint32_t* off = s.offsets.data();
  auto piece = [&](size_t a, size_t b) { return text.substr(off[a], off[b] - off[a]); };
  size_t i = 0;
  while (i < n) {
    if (is_han(cps[i])) {
      size_t j = i + 1;
      while (j < n && is_han(cps[j])) ++j;
      cut_block(text, off + i, cps + i, j - i, out);
      i = j;
    } else {
      // Outside blocks every character stands alone; "\r\n" is one segment.
      const size_t len = cps[i] == '\r' && i + 1 < n && cps[i + 1] == '\n' ? 2 : 1;
      out.push_back(piece(i, i + len));
      i += len;
    }
  }
}

void Jieba::cut_block(std::string_view text, const uint32_t* off, const char32_t* cps, size_t n,
                      std::vector<std::string_view>& out) const {
  Scratch& s = scratch();
  s.route_score.resize(n + 1);
  s.route_end.resize(n + 1);
  double* score = s.route_score.data();
  int32_t* end = s.route_end.data();
  score[n] = 0;
  // Backwards: the best route from each position, ties to the longer word,
  // exactly as max((log(freq) - log(total) + route[x + 1], x)) in jieba.calc.
  for (size_t k = n; k-- > 0;) {
    double best = 0;
    int32_t best_end = -1;
    int32_t node = 0;
    for (size_t m = k; m < n; ++m) {
      node = child(node, cps[m]);
      if (node < 0) break;
      const double w = score_[size_t(node)];
      if (std::isnan(w)) continue;  // a prefix, not a word
      const double candidate = w + score[m + 1];
      if (best_end < 0 || candidate >= best) {
        best = candidate;
        best_end = int32_t(m);
      }
    }
    if (best_end < 0) {
      best = unknown_score_ + score[k + 1];
      best_end = int32_t(k);
    }
    score[k] = best;
    end[k] = best_end;
  }
  auto piece = [&](size_t a, size_t b) { return text.substr(off[a], off[b] - off[a]); };
  // Walk the route; single ASCII letters and digits in a row become one word.
  size_t eng_begin = 0;
  bool in_eng = false;
  for (size_t x = 0; x < n;) {
    const size_t y = size_t(end[x]) + 1;
    if (y - x == 1 && is_eng(cps[x])) {
      if (!in_eng) eng_begin = x;
      in_eng = true;
    } else {
      if (in_eng) out.push_back(piece(eng_begin, x));
      in_eng = false;
      out.push_back(piece(x, y));
    }
    x = y;
  }
  if (in_eng) out.push_back(piece(eng_begin, n));
}

std::vector<std::string> Jieba::cut(std::string_view text) const {
  std::vector<std::string_view> views;
  cut(text, views);
  return {views.begin(), views.end()};
}

}  // namespace roformer::data
