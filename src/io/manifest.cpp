#include "io/manifest.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "base/common.hpp"

namespace gpt {

namespace {
constexpr const char* kHeader1 = "gpt2-train manifest 1";
constexpr const char* kHeader2 = "gpt2-train manifest 2";

std::string hex16(uint64_t v) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)v);
  return hex;
}
bool parse_hex16(const std::string& s, uint64_t& v) {
  if (s.size() != 16 || s.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) return false;
  v = std::stoull(s, nullptr, 16);
  return true;
}
}  // namespace

const FileDigest* Manifest::find(const std::string& name) const {
  for (const FileDigest& f : files)
    if (f.name == name) return &f;
  return nullptr;
}

void write_manifest(const std::string& dir, const std::vector<FileDigest>& files) {
  std::ostringstream os;
  os << kHeader2 << "\n";
  for (const FileDigest& f : files) {
    os << "file " << f.name << " " << f.size << "\n";
    for (const Extent& e : f.extents)
      os << (e.data ? "d " : "m ") << e.offset << " " << e.bytes << " " << hex16(e.xxh3) << "\n";
  }
  const std::string text = os.str(), path = dir + "/MANIFEST";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(kExitFailure, "cannot create '" + path + "': " + std::strerror(errno));
  const bool ok = ::write(fd, text.data(), text.size()) == ssize_t(text.size()) && ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) throw Error(kExitFailure, "cannot write '" + path + "': " + std::strerror(err));
}

Manifest read_manifest(const std::string& dir) {
  std::ifstream in(dir + "/MANIFEST");
  if (!in) throw input_error("checkpoint '" + dir + "' has no MANIFEST (incomplete, damaged, or not a checkpoint)");
  std::string header;
  std::getline(in, header);
  Manifest m;
  if (header == kHeader1) m.version = 1;
  else if (header == kHeader2) m.version = 2;
  else
    throw input_error("checkpoint '" + dir + "': MANIFEST starts with '" + header + "', expected '" + kHeader2 +
                      "' (or version 1's '" + kHeader1 + "')");
  auto bad = [&](const std::string& line, const std::string& why) {
    return input_error("checkpoint '" + dir + "': malformed MANIFEST line '" + line + "'" + why);
  };
  for (std::string line; std::getline(in, line);) {
    std::istringstream ls(line);
    std::string word, hex, extra;
    if (m.version == 1) {
      FileDigest d;
      if (!(ls >> d.name >> d.size >> hex) || !parse_hex16(hex, d.xxh3) || (ls >> extra)) throw bad(line, "");
      m.files.push_back(d);
      continue;
    }
    ls >> word;
    if (word == "file") {
      FileDigest d;
      if (!(ls >> d.name >> d.size) || (ls >> extra)) throw bad(line, "");
      m.files.push_back(d);
      continue;
    }
    Extent e;
    if ((word != "m" && word != "d") || m.files.empty() || !(ls >> e.offset >> e.bytes >> hex) ||
        !parse_hex16(hex, e.xxh3) || (ls >> extra))
      throw bad(line, "");
    e.data = word == "d";
    FileDigest& f = m.files.back();
    const uint64_t at = f.extents.empty() ? 0 : f.extents.back().offset + f.extents.back().bytes;
    if (e.offset != at || e.bytes == 0 || e.offset + e.bytes > f.size) throw bad(line, ": the extents do not tile the file");
    f.extents.push_back(e);
  }
  if (m.files.empty()) throw input_error("checkpoint '" + dir + "': MANIFEST lists no files");
  for (const FileDigest& f : m.files) {
    const uint64_t end = f.extents.empty() ? 0 : f.extents.back().offset + f.extents.back().bytes;
    if (m.version == 2 && end != f.size)
      throw input_error("checkpoint '" + dir + "': MANIFEST covers " + std::to_string(end) + " of the " +
                        std::to_string(f.size) + " bytes of " + f.name);
  }
  return m;
}

void verify_file(const std::string& dir, const FileDigest& want, int version, int threads) {
  const std::string path = dir + "/" + want.name;
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0)
    throw input_error("checkpoint '" + dir + "' is incomplete: '" + path + "' is missing");
  if (uint64_t(st.st_size) != want.size)
    throw input_error("checkpoint file '" + path + "' is truncated or damaged: " + std::to_string(st.st_size) +
                      " bytes, its MANIFEST says " + std::to_string(want.size));
  try {
    if (version >= 2) {
      std::vector<ReadJob> jobs;
      for (const Extent& e : want.extents)
        if (!e.data) jobs.push_back({&path, e.offset, e.bytes, e.xxh3, nullptr, 0, 0, "checkpoint file '" + path + "'"});
      read_checked(jobs, threads);
      return;
    }
    FileDigest got{want.name, 0, 0, {}};
    hash_file(path, threads, got.size, got.xxh3);
    if (got.xxh3 != want.xxh3)
      throw input_error("checkpoint file '" + path + "': checksum mismatch against its MANIFEST (corrupt file)");
  } catch (const Error& e) {
    if (e.code() == kExitBadInput) throw;
    throw input_error(std::string("checkpoint file: ") + e.what());
  }
}

}  // namespace gpt
