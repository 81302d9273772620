/* MelWeightMatrix (ONNX), the kernel behind kiln.lower.signal's lowering: the reference's
   arithmetic step by step: the mel scale in the edges' float type up to the division by
   log(10) (float64 from there), Python's float floor division for the edges. Instantiated
   once per type pair: define KILN_MEL_H (the edges' C type), KILN_MEL_CALC (the type its math
   runs in: float16 math runs in float, rounded back), KILN_MEL_LOG1P (log1p or log1pf),
   KILN_MEL_TO (the output's C type) and KILN_MEL_FN (the function's name) before this file.
   Always inlined: each call site's literal sizes become constants.

   The five scalar inputs are run-time data, checked against the output shape [rows, bins]
   the kernel was built for. Returns 0, 1 (bad sizes or edges) or -1 (out of memory). */
#define KILN_MEL_OF(v) ((double)(KILN_MEL_H)((KILN_MEL_CALC)2595 * (KILN_MEL_CALC)(KILN_MEL_H)KILN_MEL_LOG1P( \
    (KILN_MEL_CALC)(KILN_MEL_H)((KILN_MEL_CALC)(v) / (KILN_MEL_CALC)700))) / 2.302585092994046)
__attribute__((always_inline)) static inline int32_t KILN_MEL_FN(
    int64_t nb, int64_t len, int64_t rate, KILN_MEL_H lo, KILN_MEL_H hi, KILN_MEL_TO* out, int64_t rows,
    int64_t bins) {
  if (nb != bins || len / 2 + 1 != rows || nb < 1 || len < 1) return 1;
  if (!((double)lo >= 0 && (double)lo < (double)hi) || rate <= 0) return 1;
  int64_t* edges = (int64_t*)malloc(sizeof(int64_t) * (bins + 2));
  if (!edges) return -1;
  const double mlo = KILN_MEL_OF(lo), mhi = KILN_MEL_OF(hi), diff = mhi - mlo;
  for (int64_t i = 0; i < bins + 2; ++i) {
    const double mel = mlo + ((double)i * diff) / (double)(bins + 2);
    const double a = (double)((len + 1) * 700) * expm1(mel / 2595.0 * 2.302585092994046), b = (double)rate;
    double mod = fmod(a, b), div = (a - mod) / b, fl;
    if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1.0;
    if (div != 0) { fl = floor(div); if (div - fl > 0.5) fl += 1.0; } else fl = 0.0;
    if (!(fl > -9.0e18 && fl < 9.0e18)) { free(edges); return 1; }
    edges[i] = (int64_t)fl;
  }
  double* w = (double*)calloc(rows * bins + 1, sizeof(double));
  if (!w) { free(edges); return -1; }
  int rc = 0;
  for (int64_t i = 0; i < bins && !rc; ++i) {
    const int64_t left = edges[i], center = edges[i + 1], right = edges[i + 2];
    if (left < 0 || center < 0 || right < 0 || center >= rows) { rc = 1; break; }
    if (center == left) w[center * bins + i] = 1.0;
    else for (int64_t r = left; r <= center; ++r) w[r * bins + i] = (double)(r - left) / (double)(center - left);
    if (right > center) {
      if (right > rows) { rc = 1; break; }
      for (int64_t r = center; r < right; ++r) w[r * bins + i] = (double)(right - r) / (double)(right - center);
    }
  }
  if (!rc) for (int64_t q = 0; q < rows * bins; ++q) out[q] = (KILN_MEL_TO)w[q];
  free(w); free(edges);
  return rc;
}
#undef KILN_MEL_OF
