// Shards: round trip, refusal of another tokenizer, corruption and
// truncation detected at open, the HDF5 wrappers' atomic writes.
#include "data/shard.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "data/hdf5.h"
#include "test_util.h"
#include "tests/test_support.h"

namespace roformer::data {
namespace {

using testing::bert_vocab;
using testing::TempDir;

struct Fixture {
  std::vector<uint32_t> tokens;
  std::vector<uint64_t> offsets{0};
  ShardInfo info;
};

Fixture make_fixture(int docs = 50) {
  Fixture f;
  uint32_t x = 12345;
  for (int d = 0; d < docs; ++d) {
    const int len = 1 + (d * 37) % 700;
    for (int i = 0; i < len; ++i) {
      x = x * 1103515245u + 12345u;
      f.tokens.push_back(1000 + (x >> 8) % 29000);
    }
    f.offsets.push_back(f.tokens.size());
  }
  f.info.split = "train";
  f.info.tokenizer = Tokenizer(bert_vocab()).identity();
  f.info.sources = {"a.txt", "b.txt"};
  f.info.fingerprint = "0123456789abcdef";
  return f;
}

std::string error_of(const std::function<void()>& fn) {
  return ::roformer::testing::error_of<InputError>(fn);
}

TEST(Shard, RoundTripAndMetadata) {
  TempDir dir;
  const Fixture f = make_fixture();
  const std::string path = dir / "s.h5";
  write_shard(path, f.info, f.tokens, f.offsets);
  const TokenizerIdentity id = f.info.tokenizer;
  const Shard s = Shard::open(path, &id);
  EXPECT_EQ(std::vector<uint32_t>(s.tokens().begin(), s.tokens().end()), f.tokens);
  EXPECT_EQ(std::vector<uint64_t>(s.doc_offsets().begin(), s.doc_offsets().end()), f.offsets);
  EXPECT_EQ(s.info().token_dtype, "uint16");  // 30522 pieces fit
  EXPECT_EQ(s.info().num_documents, 50);
  EXPECT_EQ(s.info().sources, f.info.sources);
  EXPECT_EQ(s.info().fingerprint, f.info.fingerprint);
  EXPECT_EQ(s.document(1).size(), 38u);
  // No temporary file is left next to it.
  int files = 0;
  for (auto& e : std::filesystem::directory_iterator(dir.path()))
    files += bool(e.path().string().size());
  EXPECT_EQ(files, 1);
  const std::string text = describe_shard(path);
  EXPECT_NE(text.find("documents       50"), std::string::npos) << text;
  EXPECT_NE(text.find("uint16"), std::string::npos) << text;
}

TEST(Shard, WideVocabUsesUint32) {
  TempDir dir;
  Fixture f = make_fixture(3);
  f.info.tokenizer.vocab_size = 100000;
  f.tokens.back() = 99999;
  write_shard(dir / "w.h5", f.info, f.tokens, f.offsets);
  const Shard s = Shard::open(dir / "w.h5");
  EXPECT_EQ(s.info().token_dtype, "uint32");
  EXPECT_EQ(s.tokens().back(), 99999u);
}

TEST(Shard, OtherTokenizerIsRefusedNamingBoth) {
  TempDir dir;
  const Fixture f = make_fixture();
  write_shard(dir / "s.h5", f.info, f.tokens, f.offsets);
  TokenizerIdentity other = f.info.tokenizer;
  other.lowercase = false;
  const std::string msg = error_of([&] { Shard::open(dir / "s.h5", &other); });
  EXPECT_NE(msg.find("lowercase=1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("lowercase=0"), std::string::npos) << msg;
  other = f.info.tokenizer;
  other.vocab_hash = "ffffffffffffffff";
  const std::string msg2 = error_of([&] { Shard::open(dir / "s.h5", &other); });
  EXPECT_NE(msg2.find(f.info.tokenizer.vocab_hash), std::string::npos) << msg2;
  EXPECT_NE(msg2.find("ffffffffffffffff"), std::string::npos) << msg2;
}

TEST(Shard, TruncatedFileIsDetectedAtOpen) {
  TempDir dir;
  const Fixture f = make_fixture(200);
  write_shard(dir / "s.h5", f.info, f.tokens, f.offsets);
  const auto size = std::filesystem::file_size(dir / "s.h5");
  for (double keep : {0.1, 0.5, 0.9, 0.99}) {
    std::filesystem::copy_file(dir / "s.h5", dir / "t.h5",
                               std::filesystem::copy_options::overwrite_existing);
    std::filesystem::resize_file(dir / "t.h5", uintmax_t(double(size) * keep));
    const std::string msg = error_of([&] { Shard::open(dir / "t.h5"); });
    EXPECT_NE(msg.find(dir / "t.h5"), std::string::npos) << keep << ": " << msg;
    EXPECT_EQ(msg.find("NOT AN InputError"), std::string::npos) << msg;
  }
}

TEST(Shard, CorruptBytesAreDetectedAtOpen) {
  TempDir dir;
  const Fixture f = make_fixture(200);
  write_shard(dir / "s.h5", f.info, f.tokens, f.offsets);
  const auto size = std::filesystem::file_size(dir / "s.h5");
  // Flip bytes at several places in the data region.
  for (double at : {0.3, 0.5, 0.7}) {
    std::filesystem::copy_file(dir / "s.h5", dir / "c.h5",
                               std::filesystem::copy_options::overwrite_existing);
    std::fstream io(dir / "c.h5", std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(std::streamoff(double(size) * at));
    const char garbage[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    io.write(garbage, sizeof garbage);
    io.close();
    const std::string msg = error_of([&] { Shard::open(dir / "c.h5"); });
    EXPECT_NE(msg.find("c.h5"), std::string::npos) << at << ": " << msg;
    EXPECT_EQ(msg.find("NOT AN InputError"), std::string::npos) << msg;
  }
}

TEST(Shard, InconsistentCountsAndChecksumAreRefused) {
  TempDir dir;
  const Fixture f = make_fixture();
  const std::string path = dir / "s.h5";
  auto rewrite = [&](const std::function<void(hdf5::Group&)>& edit) {
    write_shard(path, f.info, f.tokens, f.offsets);
    hdf5::File file = hdf5::File::open(path, /*writable=*/true);
    edit(file.root());
    file.close();
  };
  rewrite([](hdf5::Group& g) { g.set_attr("num_documents", int64_t(49)); });
  EXPECT_NE(error_of([&] { Shard::open(path); }).find("doc_offsets"), std::string::npos);
  rewrite([](hdf5::Group& g) { g.set_attr("num_tokens", int64_t(5)); });
  EXPECT_NE(error_of([&] { Shard::open(path); }).find("num_tokens"), std::string::npos);
  rewrite([](hdf5::Group& g) { g.set_attr("tokens_checksum", "0000000000000000"); });
  EXPECT_NE(error_of([&] { Shard::open(path); }).find("checksum"), std::string::npos);
  rewrite([](hdf5::Group& g) { g.set_attr("vocab_size", int64_t(1000)); });
  EXPECT_NE(error_of([&] { Shard::open(path); }).find("vocab_size"), std::string::npos);
  rewrite([](hdf5::Group& g) { g.set_attr("format_version", int64_t(99)); });
  EXPECT_NE(error_of([&] { Shard::open(path); }).find("version"), std::string::npos);
  EXPECT_NE(error_of([&] { Shard::open(dir / "none.h5"); }).find("does not exist"),
            std::string::npos);
}

TEST(Hdf5, AtomicFileLeavesNothingWhenNotCommitted) {
  TempDir dir;
  {
    hdf5::AtomicFile out(dir / "x.h5");
    out.root().set_attr("answer", int64_t(42));
    EXPECT_TRUE(std::filesystem::exists(out.temp_path()));
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
  {
    hdf5::AtomicFile out(dir / "x.h5");
    auto g = out.root().create_group("model");
    const std::vector<float> w{1.5f, -2.0f, 3.25f};
    g.write_dataset<float>("weight", w);
    g.set_attr("name", "encoder");
    g.set_attr_array<int64_t>("shape", std::vector<int64_t>{3});
    out.root().set_attr("step", int64_t(7));
    out.root().set_attr("lr", 0.5);
    out.commit();
  }
  const hdf5::File in = hdf5::File::open(dir / "x.h5");
  EXPECT_EQ(in.root().attr<int64_t>("step"), 7);
  EXPECT_EQ(in.root().attr<double>("lr"), 0.5);
  const auto g = in.root().open_group("model");
  EXPECT_EQ(g.attr_string("name"), "encoder");
  EXPECT_EQ(g.attr_array<int64_t>("shape"), std::vector<int64_t>{3});
  EXPECT_EQ(g.open_dataset("weight").read<float>(), (std::vector<float>{1.5f, -2.0f, 3.25f}));
  EXPECT_EQ(g.children(), std::vector<std::string>{"weight"});
  EXPECT_THROW(in.root().attr<int64_t>("missing"), Error);
}

}  // namespace
}  // namespace roformer::data
