/* STFT (ONNX), the kernel behind kiln.lower.signal's lowering: a direct O(n^2) transform
   per frame with double accumulation over the cos/sin table (kiln_twiddles, twiddles.h).
   Instantiated once per type combination: define KILN_STFT_T (the signal's C type),
   KILN_STFT_W (the window's), KILN_STFT_TO (the output's) and KILN_STFT_FN (the function's
   name) before this file. Always inlined: each call site's literal sizes become constants.

   signal [batch, length, cin] (cin 1: real, 2: complex), window [n] or NULL (ones),
   out [batch, frames, bins, 2]. The frame step and length n are run-time data: checked
   against the output shape the kernel was built for (wlen: the window's length, or -1). Returns
   0, 1 (sizes that disagree with the output shape) or -1 (out of memory). */
__attribute__((always_inline)) static inline int32_t KILN_STFT_FN(
    const KILN_STFT_T* sig, const KILN_STFT_W* window, KILN_STFT_TO* out, int64_t fstep, int64_t n,
    int64_t batch, int64_t length, int64_t cin, int64_t frames, int64_t bins, int64_t wlen, int onesided) {
  if (fstep < 1 || n < 1 || n > length || (wlen >= 0 && n != wlen)) return 1;
  if (frames != (length - n) / fstep + 1 || bins != (onesided ? n / 2 + 1 : n)) return 1;
  if (batch * frames * bins == 0) return 0;
  double* tw = kiln_twiddles(n);
  if (!tw) return -1;
  for (int64_t bf = 0; bf < batch * frames; ++bf) {
    const int64_t b = bf / frames, f = bf % frames;
    const KILN_STFT_T* z = sig + (b * length + f * fstep) * cin;
    for (int64_t m = 0; m < bins; ++m) {
      double re = 0, im = 0;
      for (int64_t k = 0; k < n; ++k) {
        const int64_t j = (k * m) % n;
        const double w = window ? (double)window[k] : 1.0;
        const double zr = (double)z[k * cin] * w, zi = cin == 2 ? (double)z[k * cin + 1] * w : 0.0;
        const double c = tw[2 * j], sn = tw[2 * j + 1];
        re += zr * c + zi * sn;
        im += zi * c - zr * sn;
      }
      out[(bf * bins + m) * 2] = (KILN_STFT_TO)re;
      out[(bf * bins + m) * 2 + 1] = (KILN_STFT_TO)im;
    }
  }
  free(tw);
  return 0;
}
