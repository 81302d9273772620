/* Normalizer (ai.onnx.ml), the kernel behind kiln.lower.ml_preprocess' lowering: each row of
   `width` values, in float, divided by its norm (norm 0: MAX, the largest magnitude, NaN
   propagating; 1: L1, summed in double; 2: L2, squares in float summed in double, the root
   in float), a zero norm leaving the row as is. Instantiated once per input type: define
   KILN_NORMALIZER_T (the input's C type) and KILN_NORMALIZER_FN (the function's name) before
   this file. Always inlined (the norm is a constant there). Returns 0, or -1 when out of memory. */
__attribute__((always_inline)) static inline int32_t KILN_NORMALIZER_FN(
    const KILN_NORMALIZER_T* in, float* out, int64_t rows, int64_t width, int norm) {
  float* r = (float*)malloc(sizeof(float) * (width + 1));
  if (!r) return -1;
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t j = 0; j < width; ++j) r[j] = (float)in[row * width + j];
    float d = -INFINITY;
    double acc = 0;
    if (norm == 0) {
      for (int64_t j = 0; j < width; ++j) { const float v = fabsf(r[j]); d = (v > d || v != v || d != d) ? (d != d ? d : v) : d; }
    } else if (norm == 1) {
      for (int64_t j = 0; j < width; ++j) acc += (double)fabsf(r[j]);
      d = (float)acc;
    } else {
      for (int64_t j = 0; j < width; ++j) { const float sq = r[j] * r[j]; acc += (double)sq; }
      d = sqrtf((float)acc);
    }
    for (int64_t j = 0; j < width; ++j) out[row * width + j] = d == 0 ? r[j] : r[j] / d;
  }
  free(r);
  return 0;
}
