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
