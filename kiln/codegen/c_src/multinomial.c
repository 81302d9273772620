/* Multinomial (ONNX), the kernel behind kiln.lower.random's lowering: per row of logits, the
   cumulative softmax weights (unnormalised, in double), and `samples` draws from g (NumPy's
   PCG64, kiln_random.h) each found by bisection, as the reference samples. Instantiated once
   per type pair: define KILN_MULTINOMIAL_T (the logits' C type), KILN_MULTINOMIAL_O (the
   output's) and KILN_MULTINOMIAL_FN (the function's name) before this file. Always inlined.

   in [rows, classes] -> out [rows, samples]. Returns 0, or -1 when out of memory. */
__attribute__((always_inline)) static inline int32_t KILN_MULTINOMIAL_FN(
    const KILN_MULTINOMIAL_T* in, KILN_MULTINOMIAL_O* out, int64_t rows, int64_t classes, int64_t samples,
    kiln_pcg* g) {
  double* cdf = (double*)malloc(sizeof(double) * (classes + 1));
  if (!cdf) return -1;
  for (int64_t r = 0; r < rows; ++r) {
    const KILN_MULTINOMIAL_T* z = in + r * classes;
    double m = -INFINITY, s = 0;
    for (int64_t c = 0; c < classes; ++c) m = ((double)z[c] > m || z[c] != z[c] || m != m) ? (m != m ? m : (double)z[c]) : m;
    for (int64_t c = 0; c < classes; ++c) { s += exp((double)z[c] - m); cdf[c] = s; }
    for (int64_t k = 0; k < samples; ++k) {
      double u = kiln_pcg_draw(g);
      u = u * cdf[classes - 1];
      int64_t lo = 0, hi = classes;
      if (u != u) lo = classes;
      else while (lo < hi) { const int64_t mid = lo + (hi - lo) / 2; if (cdf[mid] <= u) lo = mid + 1; else hi = mid; }
      out[r * samples + k] = (KILN_MULTINOMIAL_O)(lo < classes - 1 ? lo : classes - 1);
    }
  }
  free(cdf);
  return 0;
}
