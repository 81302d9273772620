/* Unique (ONNX), the kernel behind kiln.lower.indexing's lowering. Instantiated once per
   element type: define KILN_UNIQUE_S (its stored C type), KILN_UNIQUE_K (the C type it
   is compared as), KILN_UNIQUE_KEY(v) (a stored element as compared: bfloat16 is kept as
   its bits and ordered as float) and KILN_UNIQUE_FN (the function's name) before this
   file. Always inlined: each call site's literal sizes and flags become constants again.

   The input is `rows` rows (the elements, or the slices along the axis: [outer, rows,
   inner]), merge-sorted by (value, position), NaN the largest; runs of equal rows are
   the unique values (nan_equal: NaNs are one value, as np.unique of a flattened input).
   Unique rows come in sorted order, or by first occurrence. Writes the unique rows to y
   ([outer, n, inner]) and, where not NULL, each one's first position, every row's index
   among them (inverse) and their counts; *n_out = n. Returns 0, or -1 when out of memory. */
#define KILN_AT(r, m) in[(m) / inner * (rows * inner) + (r) * inner + (m) % inner]
__attribute__((always_inline)) static inline int32_t KILN_UNIQUE_FN(
    const KILN_UNIQUE_S* in, int64_t rows, int64_t inner, int64_t outer, int nan_equal, int sorted,
    KILN_UNIQUE_S* y, int64_t* first_out, int64_t* inverse_out, int64_t* counts_out, int64_t* n_out) {
  const int64_t width = outer * inner;
  int64_t n = 0, *w = NULL;
  if (rows > 0) {
    w = (int64_t*)malloc(6 * rows * sizeof(int64_t));
    if (!w) return -1;
  }
  int64_t *cur = w, *nxt = w + rows, *first = w + 2 * rows, *count = w + 3 * rows;
  int64_t *order = w + 4 * rows, *inv = w + 5 * rows;
  for (int64_t m = 0; m < rows; ++m) cur[m] = m;
  for (int64_t span = 1; span < rows; span *= 2) {
    for (int64_t lo = 0; lo < rows; lo += 2 * span) {
      const int64_t mid = lo + span < rows ? lo + span : rows;
      const int64_t hi = lo + 2 * span < rows ? lo + 2 * span : rows;
      int64_t i = lo, j = mid, o = lo;
      while (i < mid && j < hi) {
        const int64_t p = cur[j], q = cur[i];
        int c = 0;
        for (int64_t m = 0; m < width && !c; ++m) {
          const KILN_UNIQUE_K A = KILN_UNIQUE_KEY(KILN_AT(p, m)), B = KILN_UNIQUE_KEY(KILN_AT(q, m));
          c = (A < B || (B != B && A == A)) ? -1 : (A > B || (A != A && B == B)) ? 1 : 0;
        }
        nxt[o++] = (c < 0 || (c == 0 && p < q)) ? cur[j++] : cur[i++];
      }
      while (i < mid) nxt[o++] = cur[i++];
      while (j < hi) nxt[o++] = cur[j++];
    }
    int64_t* tmp = cur; cur = nxt; nxt = tmp;
  }
  for (int64_t s = 0; s < rows; ++s) {
    int eq = s > 0;
    for (int64_t m = 0; m < width && eq; ++m) {
      const KILN_UNIQUE_K A = KILN_UNIQUE_KEY(KILN_AT(cur[s - 1], m)), B = KILN_UNIQUE_KEY(KILN_AT(cur[s], m));
      eq = nan_equal ? (A == B || (A != A && B != B)) : A == B;
    }
    if (!eq) { first[n] = cur[s]; count[n++] = 0; }
    ++count[n - 1];
    inv[cur[s]] = n - 1;
  }
  if (sorted) {
    for (int64_t g = 0; g < n; ++g) order[g] = g;
  } else {  /* by first occurrence */
    int64_t k = 0;
    for (int64_t r = 0; r < rows; ++r)
      if (first[inv[r]] == r) { nxt[inv[r]] = k; order[k++] = inv[r]; }
    for (int64_t r = 0; r < rows; ++r) inv[r] = nxt[inv[r]];
  }
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t k = 0; k < n; ++k)
      memcpy(y + (o * n + k) * inner, in + (o * rows + first[order[k]]) * inner, inner * sizeof(KILN_UNIQUE_S));
  if (first_out) for (int64_t k = 0; k < n; ++k) first_out[k] = first[order[k]];
  if (inverse_out) memcpy(inverse_out, inv, rows * sizeof(int64_t));
  if (counts_out) for (int64_t k = 0; k < n; ++k) counts_out[k] = count[order[k]];
  free(w);
  *n_out = n;
  return 0;
}
#undef KILN_AT
