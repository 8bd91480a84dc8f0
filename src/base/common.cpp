#include "base/common.hpp"
#include "base/input_file.hpp"

#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <sstream>

namespace gpt {

void check_input_file(const std::string& path, const std::string& what) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode) || S_ISDIR(st.st_mode)) return;
  const char* kind = S_ISFIFO(st.st_mode)  ? "a FIFO (named pipe)"
                     : S_ISCHR(st.st_mode) ? "a character device"
                     : S_ISBLK(st.st_mode) ? "a block device"
                     : S_ISSOCK(st.st_mode) ? "a socket"
                                            : "not a file";
  throw input_error(what + ": '" + path + "' is " + kind +
                    ", not a regular file (reading it may block or never end); give a file");
}

void throw_check_failure(const char* lib, const char* call, const std::string& detail, const char* file,
                         int line, ExitCode code) {
  std::ostringstream os;
  os << lib << " call failed: " << call;
  if (!detail.empty()) os << ": " << detail;
  os << " (" << file << ":" << line << ")";
  throw Error(code, os.str());
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    u = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;
  } else {  // subnormal: normalise the mantissa
    int e = -1;
    uint32_t m = man;
    do {
      ++e;
      m <<= 1;
    } while (!(m & 0x400u));
    u = sign | (uint32_t(112 - e) << 23) | ((m & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

void write_file_whole(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw input_error("cannot write '" + tmp + "'");
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw input_error("cannot write '" + path + "'");
  }
}

}  // namespace gpt
