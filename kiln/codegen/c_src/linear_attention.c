/* LinearAttention (ai.onnx.preview), the kernel behind kiln.lower.attention's lowering:
   the token-by-token recurrence, one (DK, DV) float64 state per (batch, K/V head),
   updated in order over the sequence, in parallel over heads. Instantiated once per type
   combination: define KILN_LA_Q, _K, _V, _S (past_state), _D (decay), _B (beta), _TO (the
   output), _TS (the present state) and KILN_LA_FN before this file. Always inlined: each
   call site's literal sizes and flags become constants again.

   q [B, T, HQ * DK], k [B, T, HKV * DK], v [B, T, HKV * DV], past [B, HKV, DK, DV] or NULL
   (zeros); gated: S *= exp(decay) per token (decay [B, T, HKV * DW], DW 1 or DK); delta:
   the delta rule with beta [B, T, BH] (BH 1 or HKV). out0 [B, T, HQ * DV] = scale * q.S,
   out1 the final state. Returns 0, or -1 when out of memory. */
__attribute__((always_inline)) static inline int32_t KILN_LA_FN(
    const KILN_LA_Q* q, const KILN_LA_K* k, const KILN_LA_V* v, const KILN_LA_S* past,
    const KILN_LA_D* decay, const KILN_LA_B* beta, KILN_LA_TO* out0, KILN_LA_TS* out1,
    int64_t B, int64_t T, int64_t HQ, int64_t HKV, int64_t DK, int64_t DV, int64_t DW, int64_t BH,
    double scale, int gated, int delta, int64_t parallel_min) {
  const int64_t G = HQ / HKV;
  int32_t failed = 0;
  #pragma omp parallel for collapse(2) schedule(static) if (B * HKV > 1 && B * T * HQ * DK * DV >= parallel_min)
  for (int64_t b = 0; b < B; ++b)
  for (int64_t g = 0; g < HKV; ++g) {
    double* S = (double*)malloc((size_t)(DK * DV + DV) * sizeof(double));
    if (!S) {
      #pragma omp atomic write
      failed = 1;
      continue;
    }
    double* u = S + DK * DV;
    for (int64_t x = 0; x < DK * DV; ++x) S[x] = past ? (double)past[(b * HKV + g) * DK * DV + x] : 0.0;
    for (int64_t i = 0; i < T; ++i) {
      const int64_t bt = b * T + i;
      if (gated) for (int64_t d = 0; d < DK; ++d) {
        const double a = exp((double)decay[(bt * HKV + g) * DW + (DW == 1 ? 0 : d)]);
        for (int64_t m = 0; m < DV; ++m) S[d * DV + m] *= a;
      }
      for (int64_t m = 0; m < DV; ++m) u[m] = (double)v[(bt * HKV + g) * DV + m];
      if (delta) {
        const double r = (double)beta[bt * BH + (BH == 1 ? 0 : g)];
        for (int64_t m = 0; m < DV; ++m) {
          double kv = 0;
          for (int64_t d = 0; d < DK; ++d) kv += S[d * DV + m] * (double)k[(bt * HKV + g) * DK + d];
          u[m] = r * (u[m] - kv);
        }
      }
      for (int64_t d = 0; d < DK; ++d) {
        const double kd = (double)k[(bt * HKV + g) * DK + d];
        for (int64_t m = 0; m < DV; ++m) S[d * DV + m] += kd * u[m];
      }
      for (int64_t h = g * G; h < (g + 1) * G; ++h)
        for (int64_t m = 0; m < DV; ++m) {
          double acc = 0;
          for (int64_t d = 0; d < DK; ++d) acc += (double)q[(bt * HQ + h) * DK + d] * S[d * DV + m];
          out0[(bt * HQ + h) * DV + m] = (KILN_LA_TO)(scale * acc);
        }
    }
    for (int64_t x = 0; x < DK * DV; ++x) out1[(b * HKV + g) * DK * DV + x] = (KILN_LA_TS)S[x];
    free(S);
  }
  return failed ? -1 : 0;
}
