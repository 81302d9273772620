#ifndef KILN_TWIDDLES
#define KILN_TWIDDLES
/* The DFT's cos/sin table for length n: tw[2j], tw[2j + 1] = cos, sin(2 pi j / n), in
   double (exact enough for every precision the reference computes in). Malloc'ed (the
   caller frees it); NULL when out of memory. */
static inline double* kiln_twiddles(int64_t n) {
  double* tw = (double*)malloc(sizeof(double) * 2 * (n > 0 ? n : 1));
  if (!tw) return 0;
  for (int64_t j = 0; j < n; ++j) {
    const double th = 6.283185307179586 * (double)j / (double)(n);
    tw[2 * j] = cos(th); tw[2 * j + 1] = sin(th);
  }
  return tw;
}
#endif
