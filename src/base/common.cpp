#include "base/common.hpp"

#include <cstdio>
#include <sstream>

namespace gpt {

void throw_check_failure(const char* lib, const char* call, const std::string& detail, const char* file,
                         int line, ExitCode code) {
  std::ostringstream os;
  os << lib << " call failed: " << call;
  if (!detail.empty()) os << ": " << detail;
  os << " (" << file << ":" << line << ")";
  throw Error(code, os.str());
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
