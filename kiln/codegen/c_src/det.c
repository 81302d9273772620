/* Det (ONNX), the kernel behind kiln.lower.matmul's lowering: LU factorization with partial
   pivoting per matrix, in double (as numpy's LAPACK getrf). Instantiated once per element
   type: define KILN_DET_T (its C type) and KILN_DET_FN (the function's name) before this
   file. Always inlined: each call site's literal sizes become constants.

   in [nb, n, n] -> out [nb]. Returns 0, or -1 when out of memory. */
__attribute__((always_inline)) static inline int32_t KILN_DET_FN(const KILN_DET_T* in, KILN_DET_T* out,
                                                                 int64_t nb, int64_t n) {
  double* w = (double*)malloc(sizeof(double) * (n * n + 1));
  if (!w) return -1;
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t i = 0; i < n * n; ++i) w[i] = (double)in[b * n * n + i];
    double det = 1.0;
    for (int64_t c = 0; c < n; ++c) {
      int64_t p = c;
      for (int64_t r = c + 1; r < n; ++r)
        if (fabs(w[r * n + c]) > fabs(w[p * n + c])) p = r;
      if (w[p * n + c] == 0.0) { det = 0.0; break; }
      if (p != c) {
        for (int64_t j = 0; j < n; ++j) { double s = w[c * n + j]; w[c * n + j] = w[p * n + j]; w[p * n + j] = s; }
        det = -det;
      }
      const double piv = w[c * n + c];
      det *= piv;
      for (int64_t r = c + 1; r < n; ++r) {
        const double f = w[r * n + c] / piv;
        for (int64_t j = c + 1; j < n; ++j) w[r * n + j] -= f * w[c * n + j];
      }
    }
    out[b] = (KILN_DET_T)det;
  }
  free(w);
  return 0;
}
