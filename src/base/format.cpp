#include "base/format.hpp"

#include <charconv>
#include <cmath>

namespace gpt {

namespace {
template <class T>
std::string to_text(T v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}
}  // namespace

std::string shortest(double v) { return to_text(v); }
std::string shortest(float v) { return to_text(v); }

std::string yaml_float(float v) {
  if (std::isnan(v)) return ".nan";
  if (std::isinf(v)) return v < 0 ? "-.inf" : ".inf";
  std::string s = to_text(v);
  const size_t e = s.find('e');
  if (s.find('.') == std::string::npos) s.insert(e == std::string::npos ? s.size() : e, ".0");
  return s;
}

}  // namespace gpt
