/* TfIdfVectorizer (ONNX), the kernel behind kiln.lower.strings' lowering, over tfidf.h: for
   each of `rows` rows of `cols` items, the items become ids (KILN_TFIDF_ID), every n-gram of
   each length (tables: ntables lengths) found in the pool is counted (cnt: one per pooled
   gram), and the row's output (`width` floats) gets, at column idx[m] of pooled gram m,
   mode 0 (TF) its count, 1 (IDF) min(count, 1) * w[m], 2 (TFIDF) count * w[m]. Returns 0,
   or 1 when out of memory. Instantiated once per input type: define KILN_TFIDF_T (the input's
   C type), KILN_TFIDF_FN (the function's name) and KILN_TFIDF_ID(x) (item x's id, an int64_t:
   the value itself, or for strings its rank in the sorted vocabulary, -1 when absent:
   kiln_str_find(vocab, nvocab, x)) before this file. Always inlined: the mode is a constant
   there. */
__attribute__((always_inline)) static inline int32_t KILN_TFIDF_FN(
    const KILN_TFIDF_T* in, int64_t rows, int64_t cols, const kiln_str* vocab, int64_t nvocab,
    const kiln_tfidf_grams* tables, int64_t ntables, const int64_t* idx, const float* w, int64_t ngrams,
    int64_t width, int mode, float* out) {
  float* cnt = (float*)malloc((size_t)(ngrams > 1 ? ngrams : 1) * sizeof(float));
  int64_t* ids = (int64_t*)malloc((size_t)(cols > 1 ? cols : 1) * sizeof(int64_t));
  if (!cnt || !ids) { free(cnt); free(ids); return 1; }
  (void)vocab; (void)nvocab;
  for (int64_t r = 0; r < rows; ++r) {
    memset(cnt, 0, (size_t)(ngrams > 1 ? ngrams : 1) * sizeof(float));
    for (int64_t c = 0; c < cols; ++c) ids[c] = KILN_TFIDF_ID(in[r * cols + c]);
    for (int64_t t = 0; t < ntables; ++t)
      kiln_tfidf_count(tables[t].g, tables[t].k, tables[t].ntable, tables[t].n, ids, cols, tables[t].max_step, cnt);
    float* o = out + r * width;
    for (int64_t j = 0; j < width; ++j) o[j] = 0.0f;
    for (int64_t k = 0; k < ngrams; ++k)
      o[idx[k]] += mode == 0 ? cnt[k] : mode == 1 ? (cnt[k] > 1.0f ? 1.0f : cnt[k]) * w[k] : cnt[k] * w[k];
  }
  free(cnt); free(ids);
  return 0;
}
