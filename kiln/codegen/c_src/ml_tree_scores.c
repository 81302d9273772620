/* The tree ensembles' per-row finish (kiln.lower.ml_trees), from the engine's (ml_trees.c)
   combined leaf weights s[] of one row and its fed flags h[] to the scores a[] (in double)
   that the post transform and the outputs take, as ONNX Runtime computes them. Instantiated
   once per accumulator type: define KILN_TREE_T (float or double) and KILN_TREE(name) (the
   functions' names) before this file. Always inlined: the node's sizes and flags are constants
   there.

   Never pick scores with `h[t] ? s[t] : 0`: GCC 12 (-O2 -march=native) vectorizes that loop
   into wrong code; the engine leaves 0 where no leaf fed a target, so products or plain reads
   do. */

/* A regressor's (and TreeEnsemble's) nt targets: AVERAGE (average != 0) divided by the number
   of trees, base values added (nb: 0, 1 for every target, or one per target); with several
   targets an unfed one scores 0. */
__attribute__((always_inline)) static inline void KILN_TREE(scores)(
    const KILN_TREE_T* s, const uint8_t* h, int64_t nt, int average, int64_t ntrees, const KILN_TREE_T* base,
    int64_t nb, double* a) {
  for (int64_t t = 0; t < nt; ++t) {
    KILN_TREE_T v = s[t];  /* 0 where no leaf fed it (the engine's contract) */
    if (average) v = v / (KILN_TREE_T)ntrees;
    if (nb) v = v + base[nb == 1 ? 0 : t];
    a[t] = nt > 1 ? (double)v * (double)h[t] : (double)v;
  }
}

/* A classifier's nc > 2 classes: base values added (the first nb classes, which count as fed);
   returns the first fed class with the highest score (class 0 when none is fed). */
__attribute__((always_inline)) static inline int64_t KILN_TREE(classes)(
    const KILN_TREE_T* s, uint8_t* h, int64_t nc, const KILN_TREE_T* base, int64_t nb, double* a) {
  int64_t best = -1;
  KILN_TREE_T bw = 0;
  for (int64_t k = 0; k < nc; ++k) {
    KILN_TREE_T v = s[k];
    if (k < nb) { v = v + base[k]; h[k] = 1; }  /* unfed: 0 + base */
    if (h[k] && (best < 0 || v > bw)) { best = k; bw = v; }
    a[k] = (double)v;
  }
  return best < 0 ? 0 : best;
}

/* A classifier's two classes (s[0], s[1]; nb base values). Sets *cls to the label's index:
   with `binary` (two labels) whether the positive score passes the threshold (0.5 when
   every leaf weight is positive, else 0), otherwise whether it is positive. Fills a[2] with
   the two scores; returns 1 when both classes were scored and the post transform applies to
   a, 0 when one score stood for both (a derived from it: 1 - p and p, the logistic pair of
   +-score (logistic != 0) or -score and score, or score and 0). */
__attribute__((always_inline)) static inline int KILN_TREE(binary)(
    KILN_TREE_T* s, const uint8_t* h, const KILN_TREE_T* base, int64_t nb, int binary, int all_positive,
    int logistic, int64_t* cls, double* a) {
  int one = !h[1], wa = nb == 0 ? 3 : -1;
  if (nb == 2) {
    if (h[1]) { s[1] = base[1] + s[0]; s[0] = -s[1]; } else { s[1] = s[1] + base[1]; s[0] = s[0] + base[0]; }
    one = 0;
  } else if (nb == 1) {
    s[0] = s[0] + base[0];
  }
  const KILN_TREE_T pos = (!one && h[1]) ? s[1] : (h[0] ? s[0] : (KILN_TREE_T)0);
  if (binary) {
    const int win = pos > (KILN_TREE_T)(all_positive ? 0.5 : 0);
    wa = win ? (all_positive ? 0 : 2) : (all_positive ? 1 : 3);
    *cls = win;
  } else {
    *cls = pos > 0 ? 1 : 0;
  }
  if (!one) {
    a[0] = (double)s[0] * (double)h[0]; a[1] = (double)s[1] * (double)h[1];  /* unfed: 0 */
    return 1;
  }
  const KILN_TREE_T sc = s[0];
  if (wa == 0 || wa == 1) { a[0] = (double)((KILN_TREE_T)1 - sc); a[1] = (double)sc; }
  else if (wa == 2 || wa == 3) {
    if (logistic) { a[0] = 1.0 / (1.0 + exp((double)sc)); a[1] = 1.0 / (1.0 + exp(-(double)sc)); }
    else { a[0] = -(double)sc; a[1] = (double)sc; }
  }
  else { a[0] = (double)sc; a[1] = 0; }
  return 0;
}
