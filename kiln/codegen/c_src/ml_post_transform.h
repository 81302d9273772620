#ifndef KILN_ML_POST_TRANSFORM
#define KILN_ML_POST_TRANSFORM
/* The `post_transform` of the ai.onnx.ml classifiers and regressors (kiln.lower.ml_common),
   over one row of n scores a[], in float64 as the reference computes them. */

/* LOGISTIC: 1 / (1 + e^-a). */
static inline void kiln_ml_logistic(double* a, int64_t n) {
  for (int64_t t = 0; t < n; ++t) a[t] = 1.0 / (1.0 + exp(-a[t]));
}

/* PROBIT: sqrt(2) erfinv(2a - 1), from Winitzki's approximation refined by three Newton steps. */
static inline void kiln_ml_probit(double* a, int64_t n) {
  for (int64_t t = 0; t < n; ++t) {
    double y = 2.0 * a[t] - 1.0;
    y = y < -1.0 ? -1.0 : y > 1.0 ? 1.0 : y;
    const double ln = log1p(-y * y), tt = 2.0 / (3.141592653589793 * 0.147) + ln / 2.0;
    const double sg = y > 0 ? 1.0 : y < 0 ? -1.0 : y;
    double x = sg * sqrt(sqrt(tt * tt - ln / 0.147) - tt);
    for (int k = 0; k < 3; ++k)
      if (fabs(y) < 1.0) x = x - (erf(x) - y) / (2.0 / sqrt(3.141592653589793) * exp(-x * x));
    a[t] = 1.4142135623730951 * x;
  }
}

/* SOFTMAX (zeros 0: every score) and SOFTMAX_ZERO (zeros 1: zero scores stay zero and take
   no part), the sum kept above the smallest normal double. */
static inline void kiln_ml_softmax(double* a, int64_t n, int zeros) {
  double m = -INFINITY, s = 0;
  for (int64_t t = 0; t < n; ++t) if (!zeros || a[t] != 0) m = (a[t] > m || a[t] != a[t]) ? a[t] : m;
  for (int64_t t = 0; t < n; ++t) { a[t] = (!zeros || a[t] != 0) ? exp(a[t] - m) : 0.0; s += a[t]; }
  s = s < 2.2250738585072014e-308 ? 2.2250738585072014e-308 : s;
  for (int64_t t = 0; t < n; ++t) a[t] = a[t] / s;
}
#endif
