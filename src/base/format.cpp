#include "base/format.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>

namespace gpt {

namespace {
// The shortest digits that read back as v (std::to_chars), laid out as Python's repr does: fixed
// notation for exponents -4..15 (0.0003, 1234.5), scientific outside (1e-05, 1e+16).
template <class T>
std::string to_text(T v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buf[64];
  const auto sci = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  const std::string s(buf, sci.ptr);
  const size_t e = s.find('e');
  const int exp = std::stoi(s.substr(e + 1));
  if (exp < -4 || exp >= 16) return s;
  int digits = 0;
  for (size_t i = 0; i < e; ++i) digits += s[i] >= '0' && s[i] <= '9';
  const auto fixed = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::fixed, std::max(0, digits - 1 - exp));
  return std::string(buf, fixed.ptr);
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

std::string ranges_text(const std::vector<int>& sorted) {
  std::string s;
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    s += (s.empty() ? "" : ",") + std::to_string(sorted[i]) + (j > i ? "-" + std::to_string(sorted[j]) : "");
    i = j + 1;
  }
  return s;
}

}  // namespace gpt
