/* erfc for float32, inline so a simd loop vectorizes it (exact GELU's 0.5 x erfc(-x / sqrt 2)
   in a GEMM epilogue): glibc's vector erfcf took 1.0-1.3 ns per element on the AVX-512 Zen 4,
   this 0.67 (a loop of 65536, one thread), within 4.5 ulp of erfc over the floats (checked
   against double erfc on 2^22 points of [-10, 10]; tests/codegen/test_erfc.py).
   For a = |x|: erfc(a) = exp(-a^2) (1 + p(q)) / (1 + 2a), q = (a - 2) / (a + 2) in [-1, 0.67)
   for a in [0, 10), p a degree-9 polynomial fitted to (1 + 2a) exp(a^2) erfc(a) - 1 (minimax by
   reweighted least squares, 1.6e-8 off; the transformation is N. Juffa's). exp(-a^2) takes the
   rounding error d of a^2 back as exp(-fl(a^2)) (1 + d). erfc(-a) = 2 - erfc(a); 0 beyond 9.25
   (erfc(9.25) < 1e-38, subnormal), and NaN stays NaN. Needs kiln_exp.h. */
#ifndef KILN_ERFC_H
#define KILN_ERFC_H
static inline float kiln_erfc_f32(float x) {
  const float a = __builtin_fabsf(x);
  const float q = (a - 2.0f) / (a + 2.0f);
  float p = -0x1.a4536cp-12f;
  p = p * q - 0x1.42a472p-10f; p = p * q + 0x1.58460ap-10f; p = p * q + 0x1.1adef0p-7f;
  p = p * q - 0x1.081868p-7f; p = p * q - 0x1.bc0b42p-5f; p = p * q + 0x1.4ffc34p-3f;
  p = p * q - 0x1.540844p-3f; p = p * q - 0x1.7bf614p-4f; p = p * q + 0x1.1ba03ap-2f;
  const float sq = a * a;
  const float d = __builtin_fmaf(a, -a, sq);
  float r = (1.0f + p) / (1.0f + 2.0f * a) * kiln_exp_clamped(-(sq < 87.0f ? sq : 87.0f));
  r = r + r * d;
  r = a > 9.25f ? 0.0f : r;
  return x < 0.0f ? 2.0f - r : r;
}
#endif
