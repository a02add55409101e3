#include "core/fp8.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace laoyao {
namespace {

struct Layout {
  int mantissa_bits, bias;
  double max;
  uint8_t max_code;
};

Layout layout(Fp8Format f) {
  return f == Fp8Format::E4M3 ? Layout{3, 7, 448.0, 0x7E} : Layout{2, 15, 57344.0, 0x7B};
}

}  // namespace

double fp8_max(Fp8Format f) { return layout(f).max; }

uint8_t fp8_from_float(float x, Fp8Format f) {
  const Layout s = layout(f);
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return 0x7F;  // (CUDA's float cast makes every NaN the canonical one first)
  const double a = std::fabs(static_cast<double>(x));
  if (std::isinf(a)) return sign | s.max_code;
  if (a == 0) return sign;
  // The grid around a: steps of 2^(e - mantissa bits) for a in [2^e, 2^(e+1)), the subnormals'
  // step below the smallest normal. Dividing by a power of two is exact; nearbyint rounds half to
  // even (the default rounding mode).
  const int emin = 1 - s.bias;
  const int e = std::max(std::ilogb(a), emin);
  const double step = std::ldexp(1.0, e - s.mantissa_bits);
  const double r = std::nearbyint(a / step) * step;
  if (r > s.max) return sign | s.max_code;
  if (r == 0) return sign;
  const int er = std::ilogb(r);
  if (er < emin)  // subnormal: the step counts the mantissa
    return static_cast<uint8_t>(sign | static_cast<int>(r / std::ldexp(1.0, emin - s.mantissa_bits)));
  const int mantissa = static_cast<int>(r / std::ldexp(1.0, er - s.mantissa_bits)) - (1 << s.mantissa_bits);
  return static_cast<uint8_t>(sign | ((er + s.bias) << s.mantissa_bits) | mantissa);
}

float fp8_to_float(uint8_t c, Fp8Format f) {
  const Layout s = layout(f);
  const float sign = (c & 0x80) ? -1.0f : 1.0f;
  const int exp_field = (c & 0x7F) >> s.mantissa_bits, mantissa = c & ((1 << s.mantissa_bits) - 1);
  if (f == Fp8Format::E4M3 && (c & 0x7F) == 0x7F) return std::numeric_limits<float>::quiet_NaN();
  if (f == Fp8Format::E5M2 && exp_field == 31)
    return mantissa == 0 ? sign * std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  if (exp_field == 0) return sign * static_cast<float>(std::ldexp(mantissa, 1 - s.bias - s.mantissa_bits));
  return sign * static_cast<float>(std::ldexp((1 << s.mantissa_bits) + mantissa, exp_field - s.bias - s.mantissa_bits));
}

}  // namespace laoyao
