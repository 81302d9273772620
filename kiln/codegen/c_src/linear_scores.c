/* LinearRegressor / LinearClassifier (ai.onnx.ml), the scores behind kiln.lower.ml_linear's
   kernels: for one row x of `width` features, s[t] = (float)(sum_j (float)x[j] * coef[t][j],
   in double) + icpt[t * icpt_step], t < n (icpt_step 0: one intercept for every target), as
   ONNX Runtime computes them. Instantiated once per input type: define KILN_LINEAR_T (the
   input's C type) and KILN_LINEAR_FN (the function's name) before this file. Always inlined. */
__attribute__((always_inline)) static inline void KILN_LINEAR_FN(
    const KILN_LINEAR_T* x, const float* coef, const float* icpt, int64_t icpt_step, int64_t n, int64_t width,
    float* s) {
  for (int64_t t = 0; t < n; ++t) {
    double acc = 0;
    for (int64_t j = 0; j < width; ++j) acc += (double)(float)x[j] * (double)coef[t * width + j];
    s[t] = (float)acc + icpt[t * icpt_step];
  }
}
