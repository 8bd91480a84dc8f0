#include "io/manifest.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>

#include "base/common.hpp"
#include "io/raw_io.hpp"

namespace gpt {

namespace {
constexpr const char* kHeader = "gpt2-train manifest 1";
constexpr size_t kChunk = size_t(8) << 20;
// Verifying reads each file whole: a few reads in flight keep a fast disk streaming.
constexpr int kReadThreads = 4;

struct StateDeleter {
  void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
};

// XXH3-64 and size of an open file, read in chunks (no whole-file buffer).
void hash_fd(int fd, const std::string& path, uint64_t& size, uint64_t& hash) {
  std::unique_ptr<XXH3_state_t, StateDeleter> st(XXH3_createState());
  if (!st || XXH3_64bits_reset(st.get()) == XXH_ERROR) throw Error(kExitFailure, "XXH3: cannot allocate its state");
  std::vector<char> buf(kChunk);
  size = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw Error(kExitFailure, "cannot read '" + path + "': " + std::strerror(errno));
    if (n == 0) break;
    XXH3_64bits_update(st.get(), buf.data(), size_t(n));
    size += uint64_t(n);
  }
  hash = XXH3_64bits_digest(st.get());
}
}  // namespace

FileDigest digest_file(const std::string& dir, const std::string& name) {
  const std::string path = dir + "/" + name;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(kExitFailure, "cannot open '" + path + "': " + std::strerror(errno));
  FileDigest d{name, 0, 0};
  try {
    hash_fd(fd, path, d.size, d.xxh3);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return d;
}

void write_manifest(const std::string& dir, const std::vector<FileDigest>& files) {
  std::ostringstream os;
  os << kHeader << "\n";
  for (const FileDigest& f : files) {
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)f.xxh3);
    os << f.name << " " << f.size << " " << hex << "\n";
  }
  const std::string text = os.str(), path = dir + "/MANIFEST";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(kExitFailure, "cannot create '" + path + "': " + std::strerror(errno));
  const bool ok = ::write(fd, text.data(), text.size()) == ssize_t(text.size()) && ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) throw Error(kExitFailure, "cannot write '" + path + "': " + std::strerror(err));
}

std::vector<FileDigest> read_manifest(const std::string& dir) {
  std::ifstream in(dir + "/MANIFEST");
  if (!in) throw input_error("checkpoint '" + dir + "' has no MANIFEST (incomplete, damaged, or not a checkpoint)");
  std::string header;
  std::getline(in, header);
  if (header != kHeader)
    throw input_error("checkpoint '" + dir + "': MANIFEST starts with '" + header + "', expected '" + kHeader + "'");
  std::vector<FileDigest> out;
  for (std::string line; std::getline(in, line);) {
    std::istringstream ls(line);
    FileDigest d;
    std::string hex;
    if (!(ls >> d.name >> d.size >> hex) || hex.size() != 16)
      throw input_error("checkpoint '" + dir + "': malformed MANIFEST line '" + line + "'");
    d.xxh3 = std::stoull(hex, nullptr, 16);
    out.push_back(d);
  }
  if (out.empty()) throw input_error("checkpoint '" + dir + "': MANIFEST lists no files");
  return out;
}

void verify_file(const std::string& dir, const FileDigest& want) {
  const std::string path = dir + "/" + want.name;
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0)
    throw input_error("checkpoint '" + dir + "' is incomplete: '" + path + "' is missing");
  if (uint64_t(st.st_size) != want.size)
    throw input_error("checkpoint file '" + path + "' is truncated or damaged: " + std::to_string(st.st_size) +
                      " bytes, its MANIFEST says " + std::to_string(want.size));
  FileDigest got{want.name, 0, 0};
  try {
    hash_file(path, kReadThreads, got.size, got.xxh3);
  } catch (const Error& e) {
    throw input_error(std::string("checkpoint file: ") + e.what());
  }
  if (got.xxh3 != want.xxh3)
    throw input_error("checkpoint file '" + path + "': checksum mismatch against its MANIFEST (corrupt file)");
}

}  // namespace gpt
