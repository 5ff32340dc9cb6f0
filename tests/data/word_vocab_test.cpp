// The Chinese word + character vocabulary (prepare --build-vocab with the
// jieba pre-tokenizer) and prepare's shards with it, on the committed
// classical Chinese excerpt and the golden dictionary excerpt.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "data/prepare.h"
#include "data/shard.h"
#include "data/utf8.h"
#include "data/vocab_builder.h"
#include "test_util.h"

namespace roformer::data {
namespace {

namespace fs = std::filesystem;
using testing::kFixtures;
using testing::TempDir;

const std::string kZhCorpus = kFixtures + "/zh/corpus/*.txt";
const std::string kDict = kFixtures + "/zh/jieba_dict.txt";

TokenizerOptions jieba_options() {
  TokenizerOptions o;
  o.pre_tokenizer = PreTokenizer::jieba;
  o.jieba_dict = kDict;
  return o;
}

size_t code_points(const std::string& s) {
  size_t n = 0;
  for (size_t pos = 0; pos < s.size(); ++n) {
    char32_t cp;
    pos += decode_utf8(s, pos, cp);
  }
  return n;
}

TEST(WordVocab, CharactersThenFrequentWordsThenWordPiece) {
  const WordCounts counts =
      count_pre_tokens(expand_inputs({kZhCorpus}), {}, jieba_options(), /*threads=*/2);
  EXPECT_EQ(counts.count("[MASK]"), 0u);
  EXPECT_EQ(counts.count(" "), 0u);
  // Frequent words of classical Chinese are jieba words of the corpus.
  ASSERT_GT(counts.count("何处"), 0u);
  VocabBuilderOptions vb;
  vb.vocab_size = 5000;
  const auto pieces = build_word_vocab(counts, jieba_options(), vb);
  // The excerpt has fewer characters and words seen twice than that.
  ASSERT_LE(pieces.size(), 5000u);
  EXPECT_EQ(pieces[0], "[PAD]");
  EXPECT_EQ(pieces[4], "[MASK]");
  EXPECT_EQ(std::set<std::string>(pieces.begin(), pieces.end()).size(), pieces.size());

  // Every character of every word is a piece, and they come first.
  std::set<std::string> chars;
  for (const auto& [w, c] : counts)
    for (size_t pos = 0; pos < w.size();) {
      char32_t cp;
      const size_t n = decode_utf8(w, pos, cp);
      chars.insert(w.substr(pos, n));
      pos += n;
    }
  ASSERT_LT(chars.size(), 4000u);
  for (size_t i = 5; i < 5 + chars.size(); ++i) EXPECT_TRUE(chars.count(pieces[i])) << pieces[i];
  // Then words, most frequent first, each seen at least twice.
  const size_t first_word = 5 + chars.size();
  EXPECT_GE(code_points(pieces[first_word]), 2u);
  int64_t last = counts.at(pieces[first_word]);
  size_t words = 0;
  for (size_t i = first_word; i < pieces.size() && code_points(pieces[i]) >= 2 &&
                              pieces[i].compare(0, 2, "##") != 0 && counts.count(pieces[i]);
       ++i, ++words) {
    EXPECT_GE(counts.at(pieces[i]), 2);
    EXPECT_LE(counts.at(pieces[i]), last) << pieces[i];
    last = counts.at(pieces[i]);
  }
  EXPECT_GT(words, 100u);
  EXPECT_EQ(first_word + words, pieces.size());  // all of them: nothing left for WordPiece

  // Deterministic, and smaller sizes are prefixes of the same order.
  EXPECT_EQ(build_word_vocab(counts, jieba_options(), vb), pieces);
  vb.vocab_size = 100;
  const auto small = build_word_vocab(counts, jieba_options(), vb);
  EXPECT_EQ(small, std::vector<std::string>(pieces.begin(), pieces.begin() + 100));
}

TEST(WordVocab, EnglishLeftOutsideGetsWordPiecePieces) {
  // Words seen once stay outside and give WordPiece its material.
  WordCounts counts{{"北京", 5}, {"大学", 3}, {"hello", 1}, {"help", 1}, {"hell", 1}};
  VocabBuilderOptions vb;
  vb.vocab_size = 40;
  vb.min_frequency = 2;
  vb.wordpiece_fraction = 0.5;
  const auto pieces = build_word_vocab(counts, jieba_options(), vb);
  const std::set<std::string> have(pieces.begin(), pieces.end());
  EXPECT_TRUE(have.count("北京") && have.count("大学"));
  EXPECT_FALSE(have.count("hello"));
  EXPECT_TRUE(have.count("##l"));  // a continuation piece of WordPiece
  EXPECT_TRUE(have.count("hel"));  // a merge shared by the three words
  EXPECT_LE(pieces.size(), 40u);
  EXPECT_THROW(build_word_vocab({}, jieba_options(), vb), InputError);
}

TEST(WordVocab, PrepareBuildsItAndShardsUseWholeWords) {
  TempDir dir;
  PrepareOptions o;
  o.vocab = dir / "vocab.txt";
  o.inputs = {kZhCorpus};
  o.shard_dir = dir / "shards";
  o.validation_fraction = 0.1;
  o.progress = false;
  o.threads = 2;
  o.pre_tokenizer = PreTokenizer::jieba;
  o.jieba_dict = kDict;
  o.build_vocab = 4300;  // ~3,950 characters, then words
  const PrepareResult r = run_prepare(o);
  EXPECT_FALSE(r.up_to_date);
  EXPECT_GT(r.documents, 300);
  const Vocab vocab = Vocab::load(o.vocab);
  EXPECT_LE(vocab.size(), 4300);  // every piece the excerpt can give
  EXPECT_GT(vocab.size(), 3800);
  std::ifstream in(o.shard_dir + "/manifest.json");
  const auto manifest = nlohmann::json::parse(in);
  EXPECT_EQ(manifest["pre_tokenizer"].get<std::string>().rfind("jieba (dict ", 0), 0u);

  // The shards hold the jieba tokenizer's ids: whole-word pieces occur.
  ASSERT_EQ(r.train_shards.size(), 1u);
  const Shard shard = Shard::open(r.train_shards[0]);
  int64_t word_tokens = 0, tokens = 0;
  for (uint32_t id : shard.tokens()) {
    ++tokens;
    word_tokens += code_points(vocab.token(int32_t(id))) >= 2 && !vocab.is_special(int32_t(id));
  }
  EXPECT_GT(word_tokens, tokens / 20);

  // Unchanged: a no-op; BERT's tokenizer on the same vocab: other shards.
  o.build_vocab = 0;
  EXPECT_TRUE(run_prepare(o).up_to_date);
  PrepareOptions plain = o;
  plain.pre_tokenizer = PreTokenizer::none;
  const PrepareResult p = run_prepare(plain);
  EXPECT_FALSE(p.up_to_date);
  EXPECT_NE(p.fingerprint, r.fingerprint);
  EXPECT_GT(p.train_tokens, r.train_tokens);  // characters instead of words
}

}  // namespace
}  // namespace roformer::data
