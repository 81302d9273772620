#ifndef KILN_SVM_COUPLE_C
#define KILN_SVM_COUPLE_C
/* SVMClassifier's probabilities (kiln.lower.ml_svm), as ONNX Runtime computes them. */

/* The pairwise probabilities r (nc x nc, r[i][j] + r[j][i] = 1) from the nc(nc-1)/2 pairwise
   scores sc through Platt's sigmoid (pa, pb per pair), clamped to [1e-7, 1 - 1e-7]. */
static inline void kiln_svm_pairwise(int64_t nc, const float* sc, const float* pa, const float* pb, float* r) {
  for (int64_t t = 0; t < nc * nc; ++t) r[t] = 0.0f;
  int64_t idx = 0;
  for (int64_t i = 0; i < nc - 1; ++i)
    for (int64_t j = i + 1; j < nc; ++j, ++idx) {
      const float val = sc[idx] * pa[idx] + pb[idx];
      const float e = 1.0f / (1.0f + expf(-fabsf(val)));
      float v = 1.0f - (val < 0 ? 1.0f - e : e);
      v = v < 1.0e-7f ? 1.0e-7f : v;
      v = v > 1.0f - 1.0e-7f ? 1.0f - 1.0e-7f : v;
      r[i * nc + j] = v; r[j * nc + i] = 1.0f - v;
    }
}

/* The class probabilities p (nc) coupled from r: libsvm's multiclass_probability (q: nc x nc
   and qp: nc scratch). */
static void kiln_svm_couple(int64_t nc, const float* r, float* q, float* qp, float* p) {
  /* libsvm's multiclass_probability in float (as ONNX Runtime runs it) */
  for (int64_t k = 0; k < nc * nc; ++k) q[k] = 0.0f;
  for (int64_t i = 0; i < nc; ++i) {
    p[i] = 1.0f / (float)nc;
    for (int64_t j = 0; j < i; ++j) { q[i * nc + i] += r[j * nc + i] * r[j * nc + i]; q[i * nc + j] = q[j * nc + i]; }
    for (int64_t j = i + 1; j < nc; ++j) { q[i * nc + i] += r[j * nc + i] * r[j * nc + i];
                                           q[i * nc + j] = -r[j * nc + i] * r[i * nc + j]; }
  }
  const float eps = 0.005f / (float)nc;
  for (int loop = 0; loop < 100; ++loop) {
    float pqp = 0.0f, err = 0.0f;
    for (int64_t i = 0; i < nc; ++i) {
      qp[i] = 0.0f;
      for (int64_t j = 0; j < nc; ++j) qp[i] += q[i * nc + j] * p[j];
      pqp += p[i] * qp[i];
    }
    for (int64_t i = 0; i < nc; ++i) { const float e = fabsf(qp[i] - pqp); if (e > err) err = e; }
    if (err < eps) break;
    for (int64_t i = 0; i < nc; ++i) {
      const float diff = (-qp[i] + pqp) / q[i * nc + i];
      p[i] += diff;
      pqp = (pqp + diff * (diff * q[i * nc + i] + 2.0f * qp[i])) / (1.0f + diff) / (1.0f + diff);
      for (int64_t j = 0; j < nc; ++j) { qp[j] = (qp[j] + diff * q[i * nc + j]) / (1.0f + diff); p[j] /= (1.0f + diff); }
    }
  }
}
#endif
