#include "data/vocab_builder.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <queue>
#include <thread>
#include <unordered_set>

#include "core/error.h"
#include "data/utf8.h"

namespace roformer::data {

namespace {

// Counts split(text) over the documents of `files`, files in parallel.
template <class Split>
WordCounts count_split(const std::vector<std::string>& files, const TextReadOptions& read,
                       int threads, Split&& split) {
  const int n =
      std::max(1, std::min<int>(threads > 0 ? threads : int(std::thread::hardware_concurrency()),
                                int(files.size())));
  std::vector<WordCounts> partial(static_cast<size_t>(n));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::atomic<size_t> next{0};
  auto work = [&](int t) {
    try {
      for (size_t f; (f = next++) < files.size();) {
        read_documents(files[f], read, [&](std::string_view text, int64_t) {
          for (auto& w : split(text)) ++partial[size_t(t)][std::move(w)];
        });
      }
    } catch (...) {
      errors[size_t(t)] = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < n; ++t) pool.emplace_back(work, t);
  work(0);
  for (auto& th : pool) th.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  WordCounts total = std::move(partial[0]);
  for (size_t t = 1; t < partial.size(); ++t)
    for (auto& [w, c] : partial[t]) total[w] += c;
  for (auto special : kSpecialTokens) total.erase(std::string(special));
  return total;
}

// Basic tokenization and jieba need no vocabulary beyond the special tokens.
Tokenizer specials_only_tokenizer(const TokenizerOptions& options) {
  std::vector<std::string> specials(std::begin(kSpecialTokens), std::end(kSpecialTokens));
  return Tokenizer(std::make_shared<const Vocab>(Vocab::from_tokens(specials)), options);
}

}  // namespace

WordCounts count_words(const std::vector<std::string>& files, const TextReadOptions& read,
                       const TokenizerOptions& tokenizer_options, int threads) {
  const Tokenizer tokenizer = specials_only_tokenizer(tokenizer_options);
  return count_split(files, read, threads,
                     [&](std::string_view text) { return tokenizer.basic_tokenize(text); });
}

WordCounts count_pre_tokens(const std::vector<std::string>& files, const TextReadOptions& read,
                            const TokenizerOptions& tokenizer_options, int threads) {
  const Tokenizer tokenizer = specials_only_tokenizer(tokenizer_options);
  return count_split(files, read, threads,
                     [&](std::string_view text) { return tokenizer.pre_tokenize(text); });
}

namespace {

struct Word {
  std::vector<int32_t> symbols;
  int64_t count;
};

inline uint64_t pair_key(int32_t a, int32_t b) {
  return (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
}

}  // namespace

std::vector<std::string> build_wordpiece_vocab(const WordCounts& counts,
                                               const VocabBuilderOptions& options) {
  const int64_t specials = int64_t(std::size(kSpecialTokens));
  RF_INPUT_CHECK(options.vocab_size > specials, "vocab size must exceed the ", specials,
                 " special tokens, not ", options.vocab_size);
  RF_INPUT_CHECK(!counts.empty(), "cannot build a vocabulary from an empty corpus");

  // Sorted words make the result independent of hash-map order.
  std::vector<std::pair<std::string, int64_t>> sorted(counts.begin(), counts.end());
  std::sort(sorted.begin(), sorted.end());

  // Alphabet: the limit_alphabet most frequent characters.
  std::map<char32_t, int64_t> char_counts;
  for (const auto& [w, c] : sorted)
    for (size_t pos = 0; pos < w.size();) {
      char32_t cp;
      pos += decode_utf8(w, pos, cp);
      char_counts[cp] += c;
    }
  std::vector<std::pair<char32_t, int64_t>> alphabet(char_counts.begin(), char_counts.end());
  std::stable_sort(alphabet.begin(), alphabet.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  if (int64_t(alphabet.size()) > options.limit_alphabet)
    alphabet.resize(size_t(options.limit_alphabet));
  std::sort(alphabet.begin(), alphabet.end());
  std::unordered_set<char32_t> kept;
  for (auto& [cp, c] : alphabet) kept.insert(cp);

  std::vector<std::string> pieces(std::begin(kSpecialTokens), std::end(kSpecialTokens));
  std::unordered_map<std::string, int32_t> piece_id;
  for (size_t i = 0; i < pieces.size(); ++i) piece_id[pieces[i]] = int32_t(i);
  auto intern = [&](const std::string& p) {
    auto [it, added] = piece_id.try_emplace(p, int32_t(pieces.size()));
    if (added) pieces.push_back(p);
    return it->second;
  };
  // Word-initial characters first, then continuations, each in code point order.
  for (bool cont : {false, true})
    for (auto& [cp, c] : alphabet) {
      std::string p = cont ? "##" : "";
      append_utf8(p, cp);
      intern(p);
    }

  std::vector<Word> words;
  for (const auto& [w, c] : sorted) {
    Word word{{}, c};
    bool ok = true;
    for (size_t pos = 0; pos < w.size();) {
      char32_t cp;
      pos += decode_utf8(w, pos, cp);
      if (!kept.count(cp)) {
        ok = false;  // a rare character: the word will be [UNK]
        break;
      }
      std::string p = word.symbols.empty() ? "" : "##";
      append_utf8(p, cp);
      word.symbols.push_back(piece_id.at(p));
    }
    if (ok && word.symbols.size() > 1) words.push_back(std::move(word));
  }
  if (int64_t(pieces.size()) >= options.vocab_size) {
    pieces.resize(size_t(options.vocab_size));
    return pieces;
  }

  // Pair counts, where each pair occurs, and a max-heap with lazy updates.
  std::unordered_map<uint64_t, int64_t> pair_count;
  std::unordered_map<uint64_t, std::vector<uint32_t>> where;
  for (uint32_t wi = 0; wi < words.size(); ++wi) {
    const auto& s = words[wi].symbols;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      const uint64_t k = pair_key(s[i], s[i + 1]);
      pair_count[k] += words[wi].count;
      where[k].push_back(wi);
    }
  }
  // Highest count first; ties: the pair made of earlier pieces (deterministic).
  using Entry = std::pair<int64_t, uint64_t>;
  auto cmp = [](const Entry& a, const Entry& b) {
    return a.first != b.first ? a.first < b.first : a.second > b.second;
  };
  std::priority_queue<Entry, std::vector<Entry>, decltype(cmp)> heap(cmp);
  for (auto& [k, c] : pair_count) heap.push({c, k});

  while (int64_t(pieces.size()) < options.vocab_size && !heap.empty()) {
    const auto [count, key] = heap.top();
    heap.pop();
    auto it = pair_count.find(key);
    if (it == pair_count.end() || it->second != count) continue;  // stale entry
    if (count < options.min_frequency) break;
    const int32_t a = int32_t(key >> 32), b = int32_t(uint32_t(key));
    const std::string& tail = pieces[size_t(b)];
    std::string merged =
        pieces[size_t(a)] + (tail.compare(0, 2, "##") == 0 ? tail.substr(2) : tail);
    const int32_t m = intern(merged);
    pair_count.erase(it);

    std::unordered_map<uint64_t, int64_t> delta;
    auto words_with = std::move(where[key]);
    where.erase(key);
    std::sort(words_with.begin(), words_with.end());
    words_with.erase(std::unique(words_with.begin(), words_with.end()), words_with.end());
    for (uint32_t wi : words_with) {
      auto& s = words[wi].symbols;
      const int64_t c = words[wi].count;
      for (size_t i = 0; i + 1 < s.size();) {
        if (s[i] != a || s[i + 1] != b) {
          ++i;
          continue;
        }
        if (i > 0) {
          delta[pair_key(s[i - 1], a)] -= c;
          delta[pair_key(s[i - 1], m)] += c;
          where[pair_key(s[i - 1], m)].push_back(wi);
        }
        if (i + 2 < s.size()) {
          delta[pair_key(b, s[i + 2])] -= c;
          delta[pair_key(m, s[i + 2])] += c;
          where[pair_key(m, s[i + 2])].push_back(wi);
        }
        s[i] = m;
        s.erase(s.begin() + std::ptrdiff_t(i) + 1);
        ++i;
      }
    }
    for (auto& [k, d] : delta) {
      if (d == 0 || k == key) continue;
      int64_t& c = pair_count[k];
      c += d;
      if (c <= 0)
        pair_count.erase(k);
      else
        heap.push({c, k});
    }
  }
  return pieces;
}

std::vector<std::string> build_word_vocab(const WordCounts& words,
                                          const TokenizerOptions& tokenizer_options,
                                          const VocabBuilderOptions& options) {
  const int64_t specials = int64_t(std::size(kSpecialTokens));
  RF_INPUT_CHECK(options.vocab_size > specials, "vocab size must exceed the ", specials,
                 " special tokens, not ", options.vocab_size);
  RF_INPUT_CHECK(!words.empty(), "cannot build a vocabulary from an empty corpus");
  RF_INPUT_CHECK(options.wordpiece_fraction >= 0 && options.wordpiece_fraction <= 1,
                 "wordpiece_fraction must be in [0, 1], not ", options.wordpiece_fraction);
  TokenizerOptions basic_options = tokenizer_options;
  basic_options.pre_tokenizer = PreTokenizer::none;
  const Tokenizer basic = specials_only_tokenizer(basic_options);
  const size_t size = size_t(options.vocab_size);

  std::vector<std::pair<std::string, int64_t>> sorted(words.begin(), words.end());
  // Most frequent first; ties in byte order (deterministic).
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });

  std::vector<std::string> pieces(std::begin(kSpecialTokens), std::end(kSpecialTokens));
  std::unordered_set<std::string> have(pieces.begin(), pieces.end());
  auto add = [&](const std::string& p) {
    if (pieces.size() < size && have.insert(p).second) pieces.push_back(p);
  };

  // 1. Characters of the basic-tokenized words.
  std::map<char32_t, int64_t> char_counts;
  std::vector<std::vector<std::string>> basic_words(sorted.size());
  for (size_t i = 0; i < sorted.size(); ++i) {
    basic_words[i] = basic.basic_tokenize(sorted[i].first);
    for (const auto& w : basic_words[i])
      for (size_t pos = 0; pos < w.size();) {
        char32_t cp;
        pos += decode_utf8(w, pos, cp);
        char_counts[cp] += sorted[i].second;
      }
  }
  std::vector<std::pair<char32_t, int64_t>> chars(char_counts.begin(), char_counts.end());
  std::stable_sort(chars.begin(), chars.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  for (const auto& [cp, c] : chars) {
    std::string p;
    append_utf8(p, cp);
    add(p);
  }

  // 2. Whole words: two or more characters, frequent enough.
  std::vector<size_t> candidates;
  for (size_t i = 0; i < sorted.size(); ++i) {
    const std::string& w = sorted[i].first;
    size_t chars_in_word = 0;
    for (size_t pos = 0; pos < w.size(); ++chars_in_word) {
      char32_t cp;
      pos += decode_utf8(w, pos, cp);
    }
    if (chars_in_word >= 2 && sorted[i].second >= options.min_frequency &&
        w.compare(0, 2, "##") != 0)
      candidates.push_back(i);
  }
  const size_t left = size - pieces.size();
  const size_t word_quota =
      left - std::min(left, size_t(std::llround(options.wordpiece_fraction * double(left))));
  std::vector<uint8_t> kept(sorted.size(), 0);
  size_t next_candidate = 0;
  for (; next_candidate < candidates.size() && pieces.size() - (size - left) < word_quota;
       ++next_candidate) {
    kept[candidates[next_candidate]] = 1;
    add(sorted[candidates[next_candidate]].first);
  }

  // 3. WordPiece on what the kept words do not cover.
  if (pieces.size() < size) {
    WordCounts rest;
    for (size_t i = 0; i < sorted.size(); ++i)
      if (!kept[i])
        for (const auto& w : basic_words[i])
          if (!have.count(w)) rest[w] += sorted[i].second;
    if (!rest.empty()) {
      VocabBuilderOptions wp = options;
      wp.vocab_size = options.vocab_size + specials;
      for (const auto& p : build_wordpiece_vocab(rest, wp)) add(p);
    }
  }
  // 4. More words while there is room.
  for (; next_candidate < candidates.size() && pieces.size() < size; ++next_candidate)
    add(sorted[candidates[next_candidate]].first);
  return pieces;
}

}  // namespace roformer::data
