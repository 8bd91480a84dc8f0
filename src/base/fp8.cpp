#include "base/fp8.hpp"

#include <cmath>

namespace gpt {

namespace {
struct Bits {
  int exp_bits, man_bits, bias;
};
Bits bits_of(Fp8Format f) { return f == Fp8Format::E4M3 ? Bits{4, 3, 7} : Bits{5, 2, 15}; }
}  // namespace

uint8_t fp8_encode(float x, Fp8Format f) {
  if (std::isnan(x)) return 0x7f;
  const Bits b = bits_of(f);
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const float a = std::fabs(x), maxval = fp8::max_finite(f);
  const int emin = 1 - b.bias;  // exponent of the smallest normal value
  const int max_code = f == Fp8Format::E4M3 ? 0x7e : 0x7b;
  int code;
  if (a >= maxval) {
    code = max_code;
  } else if (a < std::ldexp(1.0f, emin)) {
    // subnormal: a multiple of 2^(emin - man_bits); rounding up to 2^man_bits is the smallest normal code
    code = int(std::nearbyint(std::ldexp(a, b.man_bits - emin)));
  } else {
    int e = 0;
    const float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1): the exponent is e - 1
    int man = int(std::nearbyint((2.0f * m - 1.0f) * float(1 << b.man_bits)));
    int exp = e - 1;
    if (man == (1 << b.man_bits)) man = 0, ++exp;
    code = ((exp + b.bias) << b.man_bits) | man;
    if (code > max_code) code = max_code;  // rounded up past the largest finite value
  }
  return uint8_t(sign | code);
}

float fp8_decode(uint8_t q, Fp8Format f) {
  const Bits b = bits_of(f);
  const int code = q & 0x7f;
  const float sign = (q & 0x80) ? -1.0f : 1.0f;
  const int exp = code >> b.man_bits, man = code & ((1 << b.man_bits) - 1);
  if (f == Fp8Format::E4M3 && code == 0x7f) return NAN;
  if (f == Fp8Format::E5M2 && exp == 31) return man ? NAN : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(float(man), 1 - b.bias - b.man_bits);
  return sign * std::ldexp(1.0f + float(man) / float(1 << b.man_bits), exp - b.bias);
}

const char* fp8_format_name(Fp8Format f) { return f == Fp8Format::E4M3 ? "e4m3" : "e5m2"; }

}  // namespace gpt
