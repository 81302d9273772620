/* TopK (ONNX), the kernel behind kiln.lower.indexing's lowering. Instantiated once per
   element type: define KILN_TOPK_T (its C type) and KILN_TOPK_FN (the function's name)
   before this file, after kiln_par.h (kiln_par_for: the lines run on the module's threads,
   kiln's pool or OpenMP's team, never a second team beside the pool).

   Per line along the axis (lines of n elements, `inner` apart), the positions ordered by
   (value, position), NaN the largest (first when `largest`, last otherwise): for small
   k an insertion into the k best so far (most elements are rejected by one comparison
   with the k-th), else a merge sort. Writes the k best values and positions of each line
   to vals/idxs ([outer, k, inner]). Lines run in parallel when lines * n > parallel_min.
   Returns 0, or -1 when out of memory. */
#define KILN_TOPK_CAT_(a, b) a##b
#define KILN_TOPK_CAT(a, b) KILN_TOPK_CAT_(a, b)
typedef struct {
  const KILN_TOPK_T* in;
  KILN_TOPK_T* vals;
  int64_t* idxs;
  int64_t n, k, inner;
  int largest, failed;
} KILN_TOPK_CAT(KILN_TOPK_FN, _job);
#define KILN_BEFORE(p, q) kiln_before_(src[(p) * inner], src[(q) * inner], (p), (q))
#define kiln_before_(A, B, p, q) \
  ((A != A) ? ((B != B) ? p < q : largest) : (B != B) ? !largest : \
   ((largest ? A > B : A < B) || (A == B && p < q)))
/* lines [first, last) of a job, with their own scratch (a kiln_par_for chunk) */
static void KILN_TOPK_CAT(KILN_TOPK_FN, _lines)(void* ctx, int64_t first, int64_t last) {
  KILN_TOPK_CAT(KILN_TOPK_FN, _job)* job = (KILN_TOPK_CAT(KILN_TOPK_FN, _job)*)ctx;
  const KILN_TOPK_T* in = job->in;
  KILN_TOPK_T* vals = job->vals;
  int64_t* idxs = job->idxs;
  const int64_t n = job->n, k = job->k, inner = job->inner;
  const int largest = job->largest;
  int64_t* idx = (int64_t*)malloc(2 * n * sizeof(int64_t));
  if (!idx) {
    __atomic_store_n(&job->failed, 1, __ATOMIC_RELAXED);
    return;
  }
  for (int64_t line = first; line < last; ++line) {
    const KILN_TOPK_T* src = in + line / inner * (n * inner) + line % inner;
    int64_t* cur = idx;
    if (k <= 64) {  /* insertion into the k best so far */
      int64_t cnt = 0;
      for (int64_t m = 0; m < n; ++m) {
        if (cnt == k && !KILN_BEFORE(m, cur[k - 1])) continue;
        int64_t pos = cnt < k ? cnt++ : k - 1;
        for (; pos > 0 && KILN_BEFORE(m, cur[pos - 1]); --pos) cur[pos] = cur[pos - 1];
        cur[pos] = m;
      }
    } else {  /* merge sort of the whole line */
      int64_t* nxt = idx + n;
      for (int64_t m = 0; m < n; ++m) cur[m] = m;
      for (int64_t w = 1; w < n; w *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * w) {
          int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
          int64_t i = lo, j = mid, o = lo;
          while (i < mid && j < hi) nxt[o++] = KILN_BEFORE(cur[j], cur[i]) ? cur[j++] : cur[i++];
          while (i < mid) nxt[o++] = cur[i++];
          while (j < hi) nxt[o++] = cur[j++];
        }
        int64_t* tmp = cur; cur = nxt; nxt = tmp;
      }
    }
    const int64_t base = line / inner * (k * inner) + line % inner;
    for (int64_t m = 0; m < k; ++m) {
      vals[base + m * inner] = src[cur[m] * inner];
      idxs[base + m * inner] = cur[m];
    }
  }
  free(idx);
}
__attribute__((always_inline)) static inline int32_t KILN_TOPK_FN(
    const KILN_TOPK_T* in, KILN_TOPK_T* vals, int64_t* idxs, int64_t lines, int64_t n, int64_t k,
    int64_t inner, int largest, int64_t parallel_min) {
  KILN_TOPK_CAT(KILN_TOPK_FN, _job) job = {in, vals, idxs, n, k, inner, largest, 0};
  kiln_par_for(KILN_TOPK_CAT(KILN_TOPK_FN, _lines), &job, 0, lines, lines * n > parallel_min);
  return job.failed ? -1 : 0;
}
#undef kiln_before_
#undef KILN_BEFORE
#undef KILN_TOPK_CAT
#undef KILN_TOPK_CAT_
