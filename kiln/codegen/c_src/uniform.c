/* RandomUniform(Like) (ONNX), the kernel behind kiln.lower.random's lowering: n draws from g
   (NumPy's PCG64, kiln_random.h), each low + range * u with the product rounded on its own
   (volatile: no FMA), as NumPy computes it. Instantiated once per output type: define
   KILN_UNIFORM_O (the output's C type) and KILN_UNIFORM_FN (the function's name) before this
   file. Always inlined. */
__attribute__((always_inline)) static inline int32_t KILN_UNIFORM_FN(
    KILN_UNIFORM_O* out, int64_t n, double low, double range, kiln_pcg* g) {
  for (int64_t i = 0; i < n; ++i) {
    const double u = kiln_pcg_draw(g);
    volatile double p = range * u;
    out[i] = (KILN_UNIFORM_O)(low + p);
  }
  return 0;
}
