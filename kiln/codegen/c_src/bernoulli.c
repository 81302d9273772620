/* Bernoulli (ONNX), the kernel behind kiln.lower.random's lowering: out[i] = 1 when a draw u
   from g (NumPy's PCG64, kiln_random.h) is below p[i], as the reference draws. Instantiated
   once per type pair: define KILN_BERNOULLI_T (the probabilities' C type), KILN_BERNOULLI_O
   (the output's) and KILN_BERNOULLI_FN (the function's name) before this file. Always inlined. */
__attribute__((always_inline)) static inline int32_t KILN_BERNOULLI_FN(
    const KILN_BERNOULLI_T* p, KILN_BERNOULLI_O* out, int64_t n, kiln_pcg* g) {
  for (int64_t i = 0; i < n; ++i) {
    const double u = kiln_pcg_draw(g);
    out[i] = (KILN_BERNOULLI_O)(u < (double)p[i]);
  }
  return 0;
}
