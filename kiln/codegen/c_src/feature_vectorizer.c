/* FeatureVectorizer (ai.onnx.ml), the kernel behind kiln.lower.ml_preprocess' lowering: one
   input's rows (w values each) into columns col .. col + d of the output's rows (`total`
   columns), as float, cut at d or padded with zeros. Instantiated once per input type: define
   KILN_VECTORIZER_T (the input's C type) and KILN_VECTORIZER_FN (the function's name) before
   this file. Always inlined. */
__attribute__((always_inline)) static inline void KILN_VECTORIZER_FN(
    const KILN_VECTORIZER_T* in, float* out, int64_t rows, int64_t w, int64_t d, int64_t total, int64_t col) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < d; ++j)
      out[r * total + col + j] = j < w ? (float)in[r * w + j] : 0.0f;
}
