// write_file_atomically (core/file_write.h): a file is replaced whole or not
// at all, and no temporary file is left behind either way.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/file_write.h"

namespace roformer {
namespace {

namespace fs = std::filesystem;

class FileWrite : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("rf_file_write_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static std::string read(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  }
  // Every file in the folder: the target only, no temporary left.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) out.push_back(e.path().filename().string());
    return out;
  }

  fs::path dir_;
};

TEST_F(FileWrite, ReplacesTheContentAndLeavesNoTemporaryFile) {
  const fs::path p = dir_ / "vocab.txt";
  write_file_atomically(p, "vocab file", std::string_view("old\n"));
  write_file_atomically(p, "vocab file", [](std::ostream& out) { out << "new" << '\n' << 42; });
  EXPECT_EQ(read(p), "new\n42");
  EXPECT_EQ(names(), std::vector<std::string>{"vocab.txt"});
  // Bytes, not text: NULs and no newline translation.
  const std::string bytes("a\0b\r\n", 5);
  write_file_atomically(p, "vocab file", bytes);
  EXPECT_EQ(read(p), bytes);
  write_file_atomically(p, "vocab file", std::string_view());
  EXPECT_EQ(read(p), "");
}

TEST_F(FileWrite, AWriterThatThrowsKeepsTheOldFile) {
  const fs::path p = dir_ / "config.yaml";
  write_file_atomically(p, "config file", std::string_view("kept: 1\n"));
  EXPECT_THROW(write_file_atomically(p, "config file",
                                     [](std::ostream& out) {
                                       out << "half a file";
                                       throw Error("the writer failed");
                                     }),
               Error);
  EXPECT_EQ(read(p), "kept: 1\n");
  EXPECT_EQ(names(), std::vector<std::string>{"config.yaml"});
}

TEST_F(FileWrite, AFolderIsAnInputErrorNamingIt) {
  const fs::path p = dir_ / "sub";
  fs::create_directories(p);
  try {
    write_file_atomically(p, "config file", std::string_view("x"));
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot write config file '" + p.string() +
                                         "': it is a directory"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(fs::is_directory(p));
}

TEST_F(FileWrite, AMissingFolderIsAnErrorNamingTheFileAndTheReason) {
  const fs::path p = dir_ / "no" / "such" / "manifest.json";
  try {
    write_file_atomically(p, "shard manifest", std::string_view("{}"));
    FAIL() << "no error";
  } catch (const InputError& e) {
    FAIL() << "a write failure is not bad input: " << e.what();
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cannot write shard manifest '" + p.string()), std::string::npos) << m;
    EXPECT_NE(m.find("No such file or directory"), std::string::npos) << m;
  }
  EXPECT_FALSE(fs::exists(dir_ / "no"));
}

TEST_F(FileWrite, ALinkIsFollowedAndKept) {
  // A link to a file (a vocab kept elsewhere, /dev/stdout redirected to a
  // file): the file it names is replaced, the link stays a link.
  const fs::path real = dir_ / "real.txt", link = dir_ / "link.txt";
  write_file_atomically(real, "vocab file", std::string_view("old\n"));
  fs::create_symlink(real, link);
  write_file_atomically(link, "vocab file", std::string_view("new\n"));
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(link)));
  EXPECT_EQ(read(real), "new\n");
  std::vector<std::string> got = names();
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, (std::vector<std::string>{"link.txt", "real.txt"}));
  // A link to a device is written through in place.
  const fs::path to_null = dir_ / "null";
  fs::create_symlink("/dev/null", to_null);
  write_file_atomically(to_null, "vocab file", std::string_view("x"));
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(to_null)));
}

TEST_F(FileWrite, AFullDeviceFailsAndADeviceIsWrittenInPlace) {
  // /dev/null takes the bytes in place (nothing may be renamed over it).
  write_file_atomically("/dev/null", "config file", std::string_view("resolved: 1\n"));
  EXPECT_TRUE(fs::is_character_file("/dev/null"));
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full on this machine";
  try {
    write_file_atomically("/dev/full", "config file", std::string(1 << 16, 'x'));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("No space left on device"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace roformer
