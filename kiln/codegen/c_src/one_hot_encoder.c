/* OneHotEncoder (ai.onnx.ml), the kernel behind kiln.lower.ml_preprocess' lowering: for each of
   the n input values, a row of nc floats, 1 in the column of its category, else 0. The
   categories are the sorted table keys[nkeys] (cols[m]: key m's column); a value matching none
   leaves its row zero, or (zeros == 0) fails with status 1. Instantiated once per input type:
   define KILN_ONE_HOT_T (the input's C type), KILN_ONE_HOT_KEY (the keys' type: int64_t, or
   kiln_str for strings), KILN_ONE_HOT_FN (the function's name) and KILN_ONE_HOT_FIND(x) (x's
   index in keys[nkeys], or -1: kiln_one_hot_find_int or _real below for numbers, kiln_str_find
   for strings) before this file. */
#ifndef KILN_ONE_HOT_SEARCH
#define KILN_ONE_HOT_SEARCH
/* v's index in the sorted keys, or -1 (bisection) */
static inline int64_t kiln_one_hot_find_int(const int64_t* keys, int64_t nkeys, int64_t v) {
  int64_t lo = 0, hi = nkeys;
  while (lo < hi) { const int64_t mid = lo + (hi - lo) / 2; if (keys[mid] < v) lo = mid + 1; else hi = mid; }
  return lo < nkeys && keys[lo] == v ? lo : -1;
}
/* a float's: truncated to an integer; NaN and values beyond int64 match no category */
static inline int64_t kiln_one_hot_find_real(const int64_t* keys, int64_t nkeys, double d) {
  if (!(d > -9.2e18 && d < 9.2e18)) return -1;
  return kiln_one_hot_find_int(keys, nkeys, (int64_t)d);
}
#endif
__attribute__((always_inline)) static inline int32_t KILN_ONE_HOT_FN(
    const KILN_ONE_HOT_T* in, float* out, int64_t n, int64_t nc, const KILN_ONE_HOT_KEY* keys, const int64_t* cols, int64_t nkeys, int zeros) {
  memset(out, 0, sizeof(float) * (size_t)(n * nc));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t lo = KILN_ONE_HOT_FIND(in[i]);
    if (lo >= 0) out[i * nc + cols[lo]] = 1.0f;
    else if (!zeros) return 1;
  }
  return 0;
}
