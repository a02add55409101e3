// The two FP8 formats of Hopper's tensor cores (OCP's E4M3 "FN" and E5M2), as a float is cast to
// them with saturation (CUDA's __nv_cvt_float_to_fp8 with __NV_SATFINITE, which Transformer
// Engine's casts use): round to nearest even; finite values beyond the largest finite one, and
// infinities, become it (E4M3 ±448, E5M2 ±57344); every NaN becomes 0x7F, a NaN in both formats
// (CUDA's float cast canonicalises it first). E4M3 has no infinity; E5M2's 0x7C is one. The CPU
// backend's FP8 simulation and the CUDA casts are checked against these.
#pragma once
#include <cstdint>

namespace laoyao {

enum class Fp8Format { E4M3, E5M2 };

// The largest finite value: 448 (E4M3), 57344 (E5M2).
double fp8_max(Fp8Format f);
// x cast to the format's bits (sign in bit 7).
uint8_t fp8_from_float(float x, Fp8Format f);
// The value of bits `c` (exact in a float).
float fp8_to_float(uint8_t c, Fp8Format f);

}  // namespace laoyao
