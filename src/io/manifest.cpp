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
// Verifying reads each file whole: a few reads in flight keep a fast disk streaming.
constexpr int kReadThreads = 4;
}  // namespace

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
