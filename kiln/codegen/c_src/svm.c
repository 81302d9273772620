#ifndef KILN_SVM_C
#define KILN_SVM_C
/* SVMClassifier / SVMRegressor (ai.onnx.ml), the kernels behind kiln.lower.ml_svm's lowerings,
   computing in float as ONNX Runtime does (see kiln.ops.ml_svm for the semantics). Every
   function is always inlined: the generated row loop passes the node's kind and constants as
   literals, so they fold as if written out per node. */

enum { KILN_SVM_LINEAR = 0, KILN_SVM_POLY = 1, KILN_SVM_RBF = 2, KILN_SVM_SIGMOID = 3 };

/* The kernel of row x against vector v (nf features). RBF: exp(-gamma |x - v|^2), the squares
   summed in float. The others start from the dot product summed in double and rounded to
   float: LINEAR dot + add; POLY (gamma dot + coef0)^degree (power 2 or 3 as products, any
   other power 0 through powf(., degree)); SIGMOID tanh(gamma dot + coef0). */
__attribute__((always_inline)) static inline float kiln_svm_kernel(
    int kind, const float* x, const float* v, int64_t nf, float gamma, float coef0, int power, float degree,
    float add) {
  if (kind == KILN_SVM_RBF) {
    float acc = 0.0f;
    for (int64_t f = 0; f < nf; ++f) { const float d = x[f] - v[f]; acc = acc + d * d; }
    return expf(-gamma * acc);
  }
  double acc = 0;
  for (int64_t f = 0; f < nf; ++f) acc += (double)x[f] * (double)v[f];
  float k = (float)acc;
  if (kind == KILN_SVM_LINEAR) return k + add;
  k = gamma * k + coef0;
  if (kind == KILN_SVM_SIGMOID) return tanhf(k);
  return power == 2 ? k * k : power == 3 ? k * k * k : powf(k, degree);
}

/* kv[j] = the kernel of row x against support vector j (nv vectors of nf features in sv). */
__attribute__((always_inline)) static inline void kiln_svm_kernels(
    int kind, const float* x, const float* sv, int64_t nv, int64_t nf, float gamma, float coef0, int power,
    float degree, float* kv) {
  for (int64_t j = 0; j < nv; ++j) kv[j] = kiln_svm_kernel(kind, x, sv + j * nf, nf, gamma, coef0, power, degree, 0.0f);
}

/* SVMRegressor's score of row x: sum_j coef[j] * K(x, sv_j) (each product in float, summed in
   double), rounded to float, + rho. */
__attribute__((always_inline)) static inline float kiln_svm_regress(
    int kind, const float* x, const float* sv, int64_t nv, int64_t nf, const float* coef, float rho, float gamma,
    float coef0, int power, float degree) {
  double sum = 0;
  for (int64_t j = 0; j < nv; ++j) {
    const float k = kiln_svm_kernel(kind, x, sv + j * nf, nf, gamma, coef0, power, degree, 0.0f);
    sum += (double)(coef[j] * k);
  }
  return (float)sum + rho;
}

/* A linear SVMClassifier's scores of row x: a[c] = x . coef_c + rho (nc classes of nf
   coefficients); returns the first class with the highest score. */
__attribute__((always_inline)) static inline int64_t kiln_svm_linear_scores(
    const float* x, const float* coef, int64_t nc, int64_t nf, float rho, double* a) {
  int64_t best = 0;
  for (int64_t c = 0; c < nc; ++c) {
    const float k = kiln_svm_kernel(KILN_SVM_LINEAR, x, coef + c * nf, nf, 0.0f, 0.0f, 0, 0.0f, rho);
    a[c] = (double)k;
    if (k > (float)a[best]) best = c;
  }
  return best;
}

/* SVMClassifier's one-against-one vote over the kernel values kv (nv support vectors; class
   c's are vstart[c] .. vstart[c + 1]): for each pair i < j the score sum (in double, each
   product in float) of coef (nc - 1 rows of nv) times kv over both classes' vectors, + rho of
   the pair, into sc (nc (nc - 1) / 2 pairs, in order), a vote for i when positive, else for j.
   votes: nc scratch. Returns the first class with the most votes. */
__attribute__((always_inline)) static inline int64_t kiln_svm_vote(
    int64_t nc, int64_t nv, const float* kv, const float* coef, const float* rho, const int64_t* vstart, float* sc,
    int64_t* votes) {
  for (int64_t c = 0; c < nc; ++c) votes[c] = 0;
  int64_t idx = 0;
  for (int64_t i = 0; i < nc - 1; ++i)
    for (int64_t j = i + 1; j < nc; ++j) {
      double sum = 0;
      for (int64_t m = vstart[i]; m < vstart[i + 1]; ++m) sum += (double)(coef[(j - 1) * nv + m] * kv[m]);
      for (int64_t m = vstart[j]; m < vstart[j + 1]; ++m) sum += (double)(coef[i * nv + m] * kv[m]);
      sum += (double)rho[idx];
      sc[idx++] = (float)sum;
      ++votes[sum > 0 ? i : j];
    }
  int64_t best = 0;
  for (int64_t c = 1; c < nc; ++c) if (votes[c] > votes[best]) best = c;
  return best;
}
#endif
