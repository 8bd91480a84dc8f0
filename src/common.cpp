#include "common.hpp"

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

}  // namespace gpt
