// The model file's SHA-256 and its digest cache: the digest is right, remembered, and recomputed
// when the file changes or the record is damaged.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "bie/engine/file_digest.h"

namespace bie {
namespace {

TEST(FileDigest, CachedDigestFollowsTheFile) {
  namespace fs = std::filesystem;
  const fs::path home = fs::temp_directory_path() / "bie_digest_home";
  fs::remove_all(home);
  const char* old = std::getenv("BIE_HOME");
  const std::string saved = old != nullptr ? old : "";
  setenv("BIE_HOME", home.c_str(), 1);
  const fs::path file = fs::temp_directory_path() / "bie_digest_file.bin";
  {
    std::ofstream(file) << "abc";
  }
  const std::string abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
  auto first = file_sha256(file.string());
  ASSERT_TRUE(first.ok()) << first.error();
  EXPECT_EQ(*first, abc);
  ASSERT_TRUE(fs::exists(home / "digests"));
  ASSERT_EQ(std::distance(fs::directory_iterator(home / "digests"), fs::directory_iterator{}), 1);
  EXPECT_EQ(file_sha256(file.string()).value(), abc);  // from the record
  {
    std::ofstream(file, std::ios::app) << "d";  // size and mtime change
  }
  EXPECT_EQ(file_sha256(file.string()).value(), file_sha256_uncached(file.string()).value());
  EXPECT_NE(file_sha256(file.string()).value(), abc);
  for (const auto& e : fs::directory_iterator(home / "digests")) std::ofstream(e.path()) << "junk";
  EXPECT_EQ(file_sha256(file.string()).value(), file_sha256_uncached(file.string()).value());
  EXPECT_FALSE(file_sha256("/nonexistent/model.gguf").ok());
  if (old != nullptr) {
    setenv("BIE_HOME", saved.c_str(), 1);
  } else {
    unsetenv("BIE_HOME");
  }
  fs::remove_all(home);
  fs::remove(file);
}

}  // namespace
}  // namespace bie
