/* Imputer (ai.onnx.ml), the kernel behind kiln.lower.ml_preprocess' lowering: each of the n
   values of rows of `width` features that is missing (nan != 0: NaN; else equal to *bad) is
   replaced by its feature's fill value (fill_step 0: one value for every feature, 1: one per
   feature). Instantiated once per input type: define KILN_IMPUTER_T (the input's C type) and
   KILN_IMPUTER_FN (the function's name) before this file. Always inlined (the test is a
   constant there; with nan set, bad is never read). */
__attribute__((always_inline)) static inline void KILN_IMPUTER_FN(
    const KILN_IMPUTER_T* in, KILN_IMPUTER_T* out, int64_t n, int64_t width, const KILN_IMPUTER_T* fill,
    int64_t fill_step, int nan, const KILN_IMPUTER_T* bad) {
  for (int64_t q = 0; q < n; ++q) {
    const KILN_IMPUTER_T v = in[q];
    out[q] = (nan ? v != v : v == bad[0]) ? fill[fill_step ? q % width : 0] : v;
  }
}
