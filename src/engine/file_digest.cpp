#include "bie/engine/file_digest.h"

#include <fmt/format.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <vector>

#include "bie/engine/model_path.h"

namespace bie {

Result<std::string> file_sha256_uncached(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return Error{fmt::format("cannot open '{}' to hash it", path)};
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  std::vector<unsigned char> buf(1 << 20);
  size_t got = 0;
  while ((got = std::fread(buf.data(), 1, buf.size(), f)) > 0)
    EVP_DigestUpdate(ctx, buf.data(), got);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx, md, &len);
  EVP_MD_CTX_free(ctx);
  if (failed) return Error{fmt::format("read error while hashing '{}'", path)};
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) hex += fmt::format("{:02x}", md[i]);
  return hex;
}

Result<std::string> file_sha256(const std::string& path) {
  std::error_code ec;
  const std::string canon = std::filesystem::canonical(path, ec).string();
  struct stat st {};
  if (ec || ::stat(canon.c_str(), &st) != 0) return file_sha256_uncached(path);
  // What identifies this version of the file.
  const std::string stamp =
      fmt::format("{}\n{} {} {} {}\n", canon, static_cast<long long>(st.st_size),
                  static_cast<long long>(st.st_mtim.tv_sec), static_cast<long>(st.st_mtim.tv_nsec),
                  static_cast<unsigned long long>(st.st_ino));
  const std::filesystem::path dir = std::filesystem::path(bie_home()) / "digests";
  const std::filesystem::path record =
      dir / fmt::format("{:016x}.txt", std::hash<std::string>{}(canon));
  {
    std::ifstream in(record);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (text.size() == stamp.size() + 65 && text.compare(0, stamp.size(), stamp) == 0 &&
        text.back() == '\n') {
      return text.substr(stamp.size(), 64);
    }
  }
  auto sha = file_sha256_uncached(canon);
  if (!sha) return sha;
  std::filesystem::create_directories(dir, ec);
  const std::filesystem::path tmp =
      record.string() + fmt::format(".{}.tmp", static_cast<long>(::getpid()));
  {
    std::ofstream out(tmp);
    out << stamp << *sha << '\n';
  }
  std::filesystem::rename(tmp, record, ec);
  if (ec) std::filesystem::remove(tmp, ec);
  return sha;
}

}  // namespace bie
