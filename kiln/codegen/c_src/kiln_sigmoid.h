/* sigmoid(x) = 1 / (1 + exp(-x)) in float32, inline, for `#pragma omp simd` loops (Sigmoid,
   Swish/SiLU and their fusions into a conv's epilogue: EfficientNet-B0 runs it on ~6M values
   an image). The reference's overflow-free form (x >= 0 ? 1 : e) / (1 + e), e = exp(-|x|), with
   glibc's vector expf (a call, spilling the caller's vectors) took ~6 ns a 16-lane vector on
   Zen 4; this takes ~3.8, the same form with exp inline: a degree-5 polynomial (within 1.1e-7
   of exp on [-ln2/2, ln2/2]; the reduction by ln 2 in one FMA, a two-part ln 2 cost 8% more)
   whose coefficients carry a factor 2^-64, times 2^(n + 64) built from the rounding's own bits,
   so that exp(-|x|) comes out denormal where it is (no flush to 0) and 0 below 2^-150. Within
   2.7e-7 relative of sigmoid for |x| < 20, 3.9e-7 where it is a normal float, and 3.9e-45
   absolute below. The selects are bit masks: a select (?:) made GCC compute the whole formula
   under masks (its other branch folded to a constant), ~15% slower. A NaN stays NaN. */
#ifndef KILN_SIGMOID_H
#define KILN_SIGMOID_H
static inline float kiln_sigmoid_f32(float x) {
  const float a = -__builtin_fabsf(x);
  /* n = round(a / ln 2) by the 1.5 * 2^23 trick; + 127 + 64 puts n + 64's biased exponent in
     s's low bits */
  const float s = a * 1.44269504088896341f + 12583103.0f;
  const float n = s - 12583103.0f;
  const float r = a - n * 0.693147182f;    /* ln 2 rounded: n * 1.9e-9 off, <= 2.9e-7 at n = -150 */
  /* exp(r) * 2^-64: the polynomial's coefficients scaled by 2^-64 (exactly) */
  float p = 0x1.0eb6bep-71f;
  p = p * r + 0x1.573c02p-69f; p = p * r + 0x1.555cecp-67f;
  p = p * r + 0x1.fffdc0p-66f; p = p * r + 0x1.fffff0p-65f; p = p * r + 0x1p-64f;
  union { float f; int32_t i; } scale = { s }, e, num, one = { 1.0f };
  scale.i <<= 23;                                     /* 2^(n + 64) */
  e.f = p * scale.f;                                  /* exp(a), rounded once (denormal or not) */
  e.i &= ~-(int32_t)(a < -104.0f);                    /* exp(a) < 2^-150: 0 */
  const int32_t neg = -(int32_t)(x < 0.0f);
  num.i = (e.i & neg) | (one.i & ~neg);               /* x < 0 ? e : 1 */
  return num.f / (1.0f + e.f);
}
#endif
