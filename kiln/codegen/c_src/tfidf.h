#ifndef KILN_TFIDF
#define KILN_TFIDF
/* TfIdfVectorizer (ONNX), the search behind kiln.lower.strings' kernel: count, into cnt, every
   n-gram of the row ids[0..cols) (items `step` apart, step in 1..max_step) found in the table
   g of ntable pooled n-grams of n ids each, sorted lexicographically (k[m]: gram m's index in
   the pool); each window is found by bisection. */
static inline void kiln_tfidf_count(const int64_t* g, const int64_t* k, int64_t ntable, int64_t n,
                                    const int64_t* ids, int64_t cols, int64_t max_step, float* cnt) {
  for (int64_t step = 1; step <= max_step; ++step)
    for (int64_t s = 0; s + (n - 1) * step < cols; ++s) {
      int64_t a = 0, b = ntable;
      while (a < b) {  /* first gram >= the window */
        const int64_t m = a + (b - a) / 2;
        int c = 0;
        for (int64_t j = 0; j < n && !c; ++j) {
          const int64_t u = g[m * n + j], v = ids[s + j * step];
          c = (u > v) - (u < v);
        }
        if (c < 0) a = m + 1; else b = m;
      }
      int eq = a < ntable;
      for (int64_t j = 0; j < n && eq; ++j) eq = g[a * n + j] == ids[s + j * step];
      if (eq) cnt[k[a]] += 1.0f;
    }
}

/* The pooled n-grams of one length n: ntable grams of n ids each in g, sorted
   lexicographically (k[m]: gram m's index in the pool), matched with items up to max_step
   apart. */
typedef struct { const int64_t* g; const int64_t* k; int64_t ntable, n, max_step; } kiln_tfidf_grams;
#endif
