/* DFT (ONNX), the kernel behind kiln.lower.signal's lowering: a direct O(n^2) transform of
   every line along axis `a`, with double accumulation over the cos/sin table (kiln_twiddles,
   twiddles.h). Instantiated once per type pair: define KILN_DFT_T (the input's C type),
   KILN_DFT_TO (the output's) and KILN_DFT_FN (the function's name) before this file. The
   entry is always inlined (each call site's literal shapes and flags checked as constants);
   the lines are a kiln_par_for job.

   in [idims] (last dim cin: 1 real, 2 complex) -> out [odims] (last dim cout). The axis (a
   < 0 counts from the end) and the length n (n_given 0: the default, nin or 2 (nin - 1) for
   an inverse onesided transform) may be run-time data: checked against the shapes the
   kernel was built for. inverse && onesided is the real inverse (Hermitian input, one real
   output per point); otherwise a complex transform, scaled by 1 / n when inverse. Lines run
   in parallel when `parallel`, on the module's threads (kiln_par_for: include kiln_par.h
   before this file). Returns 0, 1 (sizes that disagree with the shapes) or -1 (out of memory). */
#define KILN_DFT_CAT_(a, b) a##b
#define KILN_DFT_CAT(a, b) KILN_DFT_CAT_(a, b)
typedef struct {
  const KILN_DFT_T* in;
  KILN_DFT_TO* out;
  const double* tw;
  int64_t inner, nin, m_out, n, cin, cout, step, ostep;
  int inverse, irfft;
} KILN_DFT_CAT(KILN_DFT_FN, _job);
/* lines [first, last) of a job */
static void KILN_DFT_CAT(KILN_DFT_FN, _lines)(void* ctx, int64_t first, int64_t last) {
  const KILN_DFT_CAT(KILN_DFT_FN, _job)* job = (const KILN_DFT_CAT(KILN_DFT_FN, _job)*)ctx;
  const KILN_DFT_T* in = job->in;
  KILN_DFT_TO* out = job->out;
  const double* tw = job->tw;
  const int64_t inner = job->inner, nin = job->nin, m_out = job->m_out, n = job->n, cin = job->cin;
  const int64_t cout = job->cout, step = job->step, ostep = job->ostep;
  const int inverse = job->inverse, irfft = job->irfft;
  for (int64_t line = first; line < last; ++line) {
    const int64_t o = line / inner, i = line % inner;
    const int64_t base = (o * nin * inner + i) * cin, obase = (o * m_out * inner + i) * cout;
    for (int64_t m = 0; m < m_out; ++m) {
      if (irfft) {
        double s = 0;
        if (nin > 0) s = (double)in[base];
        for (int64_t k = 1; k <= (n - 1) / 2 && k < nin; ++k) {
          const int64_t j = (k * m) % n;
          const double zr = (double)in[base + k * step], zi = cin == 2 ? (double)in[base + k * step + 1] : 0.0;
          s += 2.0 * (zr * tw[2 * j] - zi * tw[2 * j + 1]);
        }
        if (n % 2 == 0 && n / 2 < nin) s += (m % 2 ? -1.0 : 1.0) * (double)in[base + (n / 2) * step];
        out[obase + m * ostep] = (KILN_DFT_TO)(s * (1.0 / (double)n));
        continue;
      }
      double re = 0, im = 0;
      const int64_t kn = nin < n ? nin : n;
      for (int64_t k = 0; k < kn; ++k) {
        const int64_t j = (k * m) % n;
        const double zr = (double)in[base + k * step], zi = cin == 2 ? (double)in[base + k * step + 1] : 0.0;
        const double c = tw[2 * j], sn = tw[2 * j + 1];
        if (inverse) { re += zr * c - zi * sn; im += zi * c + zr * sn; }
        else { re += zr * c + zi * sn; im += zi * c - zr * sn; }
      }
      out[obase + m * ostep] = (KILN_DFT_TO)(inverse ? re * (1.0 / (double)n) : re);
      out[obase + m * ostep + 1] = (KILN_DFT_TO)(inverse ? im * (1.0 / (double)n) : im);
    }
  }
}
__attribute__((always_inline)) static inline int32_t KILN_DFT_FN(
    const KILN_DFT_T* in, KILN_DFT_TO* out, const int64_t* idims, const int64_t* odims, int64_t rank,
    int64_t a, int64_t n, int n_given, int64_t cin, int64_t cout, int inverse, int onesided, int parallel) {
  if (a < 0) a += rank;
  if (a < 0 || a >= rank - 1) return 1;
  int64_t outer = 1, inner = 1;
  for (int64_t q = 0; q < a; ++q) { outer *= idims[q]; if (odims[q] != idims[q]) return 1; }
  for (int64_t q = a + 1; q < rank - 1; ++q) { inner *= idims[q]; if (odims[q] != idims[q]) return 1; }
  const int64_t nin = idims[a], m_out = odims[a];
  const int irfft = inverse && onesided;
  if (!n_given) n = irfft ? 2 * (nin - 1) : nin;
  if (n < 1 || (onesided && !inverse ? n / 2 + 1 : n) != m_out) return 1;
  if (outer * inner * m_out == 0) return 0;
  double* tw = kiln_twiddles(n);
  if (!tw) return -1;
  const int64_t step = inner * cin, ostep = inner * cout;
  const KILN_DFT_CAT(KILN_DFT_FN, _job) job = {in, out, tw, inner, nin, m_out, n, cin, cout, step, ostep,
                                              inverse, irfft};
  kiln_par_for(KILN_DFT_CAT(KILN_DFT_FN, _lines), (void*)&job, 0, outer * inner, parallel);
  free(tw);
  return 0;
}
#undef KILN_DFT_CAT
#undef KILN_DFT_CAT_
