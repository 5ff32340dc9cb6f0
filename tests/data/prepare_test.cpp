// roformer prepare: shards from the committed corpus excerpt, the no-op
// re-run, the train/validation split, every kind of bad input, and the vocab
// builder.
#include "data/prepare.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "core/error.h"
#include "data/packing.h"
#include "data/shard.h"
#include "data/text_reader.h"
#include "data/vocab_builder.h"
#include "test_util.h"
#include "tests/test_support.h"

namespace roformer::data {
namespace {

namespace fs = std::filesystem;
using testing::bert_vocab;
using testing::kBertVocab;
using testing::kCorpus;
using testing::TempDir;
using testing::write_file;

PrepareOptions corpus_options(const TempDir& dir) {
  PrepareOptions o;
  o.vocab = kBertVocab;
  o.inputs = {kCorpus + "/sotu/*.txt", kCorpus + "/moby-dick/*.txt"};
  o.shard_dir = dir / "shards";
  o.validation_fraction = 0.3;
  o.split_seed = 5;
  o.progress = false;
  o.threads = 2;
  return o;
}

std::string error_of(const std::function<void()>& fn) {
  return ::roformer::testing::error_of<InputError>(fn);
}

bool has_temp_files(const fs::path& dir) {
  if (!fs::exists(dir)) return false;
  for (auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp") != std::string::npos) return true;
  return false;
}

TEST(Prepare, ShardsFromTheCorpusExcerpt) {
  TempDir dir;
  const PrepareOptions o = corpus_options(dir);
  const PrepareResult r = run_prepare(o);
  EXPECT_FALSE(r.up_to_date);
  EXPECT_EQ(r.files, 7);
  EXPECT_EQ(r.documents, 7);  // one document per file
  EXPECT_EQ(r.validation_documents, 2);
  ASSERT_EQ(r.train_shards.size(), 1u);
  ASSERT_EQ(r.validation_shards.size(), 1u);
  EXPECT_EQ(list_shards(o.shard_dir, "train"), r.train_shards);
  EXPECT_EQ(list_shards(o.shard_dir, "validation"), r.validation_shards);

  // The shards hold exactly the tokenizer's ids of each document, each
  // document in one split only.
  const Tokenizer tok(bert_vocab());
  std::multiset<std::vector<uint32_t>> want;
  int64_t want_tokens = 0;
  for (const auto& f : expand_inputs(o.inputs))
    read_documents(f, {}, [&](std::string_view text, int64_t) {
      auto ids = tok.encode_ids(text);
      want.insert(std::vector<uint32_t>(ids.begin(), ids.end()));
      want_tokens += int64_t(ids.size());
    });
  std::multiset<std::vector<uint32_t>> got;
  const TokenizerIdentity id = tok.identity();
  for (const auto& path : {r.train_shards[0], r.validation_shards[0]}) {
    const Shard s = Shard::open(path, &id);
    for (int64_t d = 0; d < s.num_documents(); ++d)
      got.insert(std::vector<uint32_t>(s.document(d).begin(), s.document(d).end()));
    EXPECT_EQ(s.info().fingerprint, r.fingerprint);
    EXPECT_FALSE(s.info().sources.empty());
  }
  EXPECT_EQ(got, want);
  EXPECT_EQ(r.train_tokens + r.validation_tokens, want_tokens);
  EXPECT_GT(want_tokens, 30000);
  EXPECT_FALSE(has_temp_files(o.shard_dir));

  // Unchanged inputs and options: nothing to do, files untouched.
  const auto mtime = fs::last_write_time(r.train_shards[0]);
  const PrepareResult again = run_prepare(o);
  EXPECT_TRUE(again.up_to_date);
  EXPECT_EQ(again.train_shards, r.train_shards);
  EXPECT_EQ(fs::last_write_time(r.train_shards[0]), mtime);

  // Another split seed rebuilds; the split is by whole documents either way.
  PrepareOptions o2 = o;
  o2.split_seed = 6;
  const PrepareResult r2 = run_prepare(o2);
  EXPECT_FALSE(r2.up_to_date);
  EXPECT_NE(r2.fingerprint, r.fingerprint);
  EXPECT_EQ(r2.train_tokens + r2.validation_tokens, want_tokens);
}

TEST(Prepare, SmallShardsAndChangedInputs) {
  TempDir dir;
  PrepareOptions o = corpus_options(dir);
  o.inputs = {dir / "in/*.txt"};
  for (int i = 0; i < 6; ++i)
    write_file(dir / ("in/" + std::to_string(i) + ".txt"),
               "Document " + std::to_string(i) + " first paragraph.\n\nDocument " +
                   std::to_string(i) + " second one, much longer than the first one.\n");
  o.validation_fraction = 0.0;
  o.max_shard_tokens = 30;
  const PrepareResult r = run_prepare(o);
  EXPECT_EQ(r.documents, 12);  // blank lines separate documents
  EXPECT_GT(r.train_shards.size(), 2u);
  EXPECT_TRUE(r.validation_shards.empty());
  EXPECT_TRUE(run_prepare(o).up_to_date);
  write_file(dir / "in/3.txt", "Changed text.\n");
  const PrepareResult changed = run_prepare(o);
  EXPECT_FALSE(changed.up_to_date);
  EXPECT_EQ(changed.documents, 11);
  // Shards of the earlier, larger run are gone.
  std::set<std::string> files;
  for (auto& e : fs::directory_iterator(o.shard_dir)) files.insert(e.path().string());
  EXPECT_EQ(files.size(), changed.train_shards.size() + 1);  // + manifest.json
  const auto shards = open_shards(changed.train_shards);
  EXPECT_EQ(Packing(shards, 16).num_tokens(), changed.train_tokens);
}

TEST(Prepare, JsonLines) {
  TempDir dir;
  PrepareOptions o = corpus_options(dir);
  o.inputs = {dir / "docs.jsonl"};
  o.input_format = "jsonl";
  o.jsonl_field = "body";
  o.validation_fraction = 0.0;
  write_file(dir / "docs.jsonl",
             "{\"body\": \"The whale.\", \"id\": 1}\n\n{\"body\": \"Call me Ishmael.\"}\n");
  const PrepareResult r = run_prepare(o);
  EXPECT_EQ(r.documents, 2);
  EXPECT_EQ(r.train_tokens, 3 + 6);  // the whale . / call me is ##hma ##el .
  write_file(dir / "docs.jsonl", "{\"body\": \"ok\"}\n{\"text\": \"no body\"}\n");
  const std::string msg = error_of([&] { run_prepare(o); });
  EXPECT_NE(msg.find(dir / "docs.jsonl:2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'body'"), std::string::npos) << msg;
  write_file(dir / "docs.jsonl", "{\"body\": \"ok\"}\n{\"body\": \"unterminated}\n");
  EXPECT_NE(error_of([&] { run_prepare(o); }).find("docs.jsonl:2: invalid JSON"),
            std::string::npos);
}

TEST(Prepare, BadInputsAreClearErrorsAndLeaveNoShard) {
  TempDir dir;
  PrepareOptions o = corpus_options(dir);
  write_file(dir / "good.txt", "Some text.\n");
  auto run_with = [&](const std::vector<std::string>& inputs) {
    PrepareOptions x = o;
    x.inputs = inputs;
    return error_of([&] { run_prepare(x); });
  };
  // Empty file.
  write_file(dir / "empty.txt", "");
  std::string msg = run_with({dir / "good.txt", dir / "empty.txt"});
  EXPECT_NE(msg.find("empty.txt"), std::string::npos) << msg;
  EXPECT_NE(msg.find("empty"), std::string::npos) << msg;
  write_file(dir / "blank.txt", "\n  \n\n");
  msg = run_with({dir / "blank.txt"});
  EXPECT_NE(msg.find("blank.txt' holds no document"), std::string::npos) << msg;
  // Invalid UTF-8: file, line and byte offset.
  write_file(dir / "bad.txt", "line one\nline two \xC3\x28 here\n");
  msg = run_with({dir / "good.txt", dir / "bad.txt"});
  EXPECT_NE(msg.find("bad.txt:2: invalid UTF-8 at byte offset 18"), std::string::npos) << msg;
  // ... or replaced when configured.
  PrepareOptions replace = o;
  replace.inputs = {dir / "bad.txt"};
  replace.invalid_utf8 = "replace";
  replace.validation_fraction = 0;
  replace.shard_dir = dir / "replaced";
  EXPECT_EQ(run_prepare(replace).train_tokens, 6);  // line one line two ( here
  // Missing input, glob without match.
  msg = run_with({dir / "nothing.txt"});
  EXPECT_NE(msg.find("nothing.txt' does not exist"), std::string::npos) << msg;
  msg = run_with({dir / "*.none"});
  EXPECT_NE(msg.find("matches no file"), std::string::npos) << msg;
  // A vocab without [MASK].
  write_file(dir / "small_vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\nsome\n");
  PrepareOptions v = o;
  v.inputs = {dir / "good.txt"};
  v.vocab = dir / "small_vocab.txt";
  msg = error_of([&] { run_prepare(v); });
  EXPECT_NE(msg.find("small_vocab.txt"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[MASK]"), std::string::npos) << msg;
  // Bad option values.
  PrepareOptions f = o;
  f.input_format = "csv";
  EXPECT_NE(error_of([&] { run_prepare(f); }).find("input_format"), std::string::npos);
  // None of the failed runs left a shard or a manifest behind.
  EXPECT_FALSE(has_temp_files(o.shard_dir));
  EXPECT_THROW(list_shards(o.shard_dir, "train"), InputError);
}

TEST(VocabBuilder, LearnsAWordPieceVocabulary) {
  TempDir dir;
  const std::vector<std::string> files = expand_inputs({kCorpus + "/moby-dick/*.txt"});
  const WordCounts counts = count_words(files, {}, {}, 2);
  EXPECT_GT(counts.at("whale"), 10);
  VocabBuilderOptions vb;
  vb.vocab_size = 1500;
  const auto pieces = build_wordpiece_vocab(counts, vb);
  ASSERT_EQ(pieces.size(), 1500u);
  EXPECT_EQ(pieces[0], "[PAD]");
  EXPECT_EQ(pieces[4], "[MASK]");
  EXPECT_EQ(std::set<std::string>(pieces.begin(), pieces.end()).size(), pieces.size());
  EXPECT_NE(std::find(pieces.begin(), pieces.end(), "the"), pieces.end());
  EXPECT_EQ(build_wordpiece_vocab(counts, vb), pieces) << "deterministic";
  // Tokenizing the corpus with it: no [UNK], and frequent words are one piece.
  const Tokenizer tok(std::make_shared<const Vocab>(Vocab::from_tokens(pieces)));
  int64_t tokens = 0, unknown = 0;
  for (const auto& f : files)
    read_documents(f, {}, [&](std::string_view text, int64_t) {
      for (int32_t id : tok.encode_ids(text)) {
        ++tokens;
        unknown += id == tok.vocab().special().unk;
      }
    });
  EXPECT_EQ(unknown, 0);
  EXPECT_EQ(tok.tokenize("the whale"), (std::vector<std::string>{"the", "whale"}));

  // Through prepare: the vocab is written, then reused unchanged.
  PrepareOptions o = corpus_options(dir);
  o.inputs = {kCorpus + "/moby-dick/*.txt"};
  o.vocab = dir / "vocab/learned.txt";
  o.build_vocab = 800;
  const PrepareResult r = run_prepare(o);
  EXPECT_EQ(Vocab::load(o.vocab).size(), 800);
  const auto mtime = fs::last_write_time(o.vocab);
  EXPECT_TRUE(run_prepare(o).up_to_date);
  EXPECT_EQ(fs::last_write_time(o.vocab), mtime);
  // Shards of this vocab are refused by a tokenizer of another.
  const TokenizerIdentity bert = Tokenizer(bert_vocab()).identity();
  EXPECT_THROW(Shard::open(r.train_shards[0], &bert), InputError);
}

}  // namespace
}  // namespace roformer::data
