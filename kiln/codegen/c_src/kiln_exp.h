/* exp as Cephes' expf, shared by the kernels that inline it in a simd loop (a call would
   stop vectorisation and spill live accumulators): range reduction by ln 2 in two parts,
   degree-6 polynomial, within 1e-7 relative of exp for x in [-87.3, 88]. The caller clamps
   x into that range first (each kernel decides what lies outside it). */
#ifndef KILN_EXP_H
#define KILN_EXP_H
static inline float kiln_exp_clamped(float x) {
  /* n = x / ln 2 rounded, by the 1.5 * 2^23 trick (floorf does not vectorise where the
     rounding may trap); C keeps the sum's order, so the addition is not folded away */
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f; p = p * r + 8.3334519073e-3f; p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f; p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  union { int32_t i; float f; } scale = { ((int32_t)n + 127) << 23 };  /* 2^n */
  return p * scale.f;
}
#endif
