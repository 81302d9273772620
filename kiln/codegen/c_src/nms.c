/* NonMaxSuppression (ONNX), the kernel behind kiln.lower.detection's lowering.
   Instantiated once per element type: define KILN_NMS_T (the boxes' and scores' C type)
   and KILN_NMS_FN (the function's name) before this file. Always inlined: each call
   site's literal sizes become constants again.

   Per (batch, class): candidates over the score threshold, merge-sorted by descending
   score (ties keep box order, NaN last), then the reference's greedy loop. The float
   products that the reference rounds (areas, intersection) go through volatiles, so the
   compiler cannot fuse them into FMAs and move an IoU across the threshold.

   boxes [nb, n, 4], scores [nb, nc, n]; writes (batch, class, box) triples to out
   (at most cap of them) and their number to *selected. Returns 0, 1 (iou_t outside
   [0, 1]), 2 (more than cap selected: KILN_FAIL with the count) or -1 (out of memory). */
#define T KILN_NMS_T
#define KMIN(a, b) (((a) < (b) || (a) != (a)) ? (a) : (b))
#define KMAX(a, b) (((a) > (b) || (a) != (a)) ? (a) : (b))
#define BEFORE(p, q) (s[p] > s[q] || (s[q] != s[q] && s[p] == s[p]))
__attribute__((always_inline)) static inline int32_t KILN_NMS_FN(
    const T* boxes, const T* scores, int64_t nb, int64_t nc, int64_t n, int64_t limit, T iou_t,
    int has_score, double score_t, int center, int64_t cap, int64_t* out, int64_t* selected) {
  *selected = 0;
  if (!(iou_t >= (T)0 && iou_t <= (T)1)) return 1;
  int64_t count = 0;
  if (limit > 0 && nb * nc * n > 0) {
    T* cor = (T*)malloc(sizeof(T) * (size_t)(nb * n * 4) + sizeof(T) * (size_t)(nb * n));
    int64_t* idx = (int64_t*)malloc(sizeof(int64_t) * (size_t)(3 * n));
    if (!cor || !idx) { free(cor); free(idx); return -1; }
    T* area = cor + nb * n * 4;
    for (int64_t q = 0; q < nb * n; ++q) {
      const T* bx = boxes + q * 4;
      T e0, e1, e2, e3;
      if (center) {
        const T xc = bx[0], yc = bx[1], w = bx[2], h = bx[3];
        e0 = yc - h / (T)2; e1 = xc - w / (T)2; e2 = yc + h / (T)2; e3 = xc + w / (T)2;
      } else {
        e0 = KMIN(bx[0], bx[2]); e1 = KMIN(bx[1], bx[3]); e2 = KMAX(bx[0], bx[2]); e3 = KMAX(bx[1], bx[3]);
      }
      volatile T c0 = e0, c1 = e1, c2 = e2, c3 = e3;
      cor[4 * q] = c0; cor[4 * q + 1] = c1; cor[4 * q + 2] = c2; cor[4 * q + 3] = c3;
      volatile T a = (T)(cor[4 * q + 2] - cor[4 * q]) * (T)(cor[4 * q + 3] - cor[4 * q + 1]);
      area[q] = a;
    }
    int64_t *cur = idx, *nxt = idx + n, *kept = idx + 2 * n;
    for (int64_t bc = 0; bc < nb * nc; ++bc) {
      const int64_t b = bc / nc;
      const T* s = scores + bc * n;
      int64_t m = 0;
      for (int64_t i = 0; i < n; ++i)
        if (!has_score || s[i] > score_t) cur[m++] = i;
      for (int64_t span = 1; span < m; span *= 2) {
        for (int64_t lo = 0; lo < m; lo += 2 * span) {
          const int64_t mid = lo + span < m ? lo + span : m, hi = lo + 2 * span < m ? lo + 2 * span : m;
          int64_t i = lo, j = mid, o = lo;
          while (i < mid && j < hi) nxt[o++] = BEFORE(cur[j], cur[i]) ? cur[j++] : cur[i++];
          while (i < mid) nxt[o++] = cur[i++];
          while (j < hi) nxt[o++] = cur[j++];
        }
        int64_t* tmp = cur; cur = nxt; nxt = tmp;
      }
      int64_t nk = 0;
      for (int64_t r = 0; r < m && nk < limit; ++r) {
        const int64_t i = cur[r];
        const T* bi = cor + (b * n + i) * 4;
        const T ai = area[b * n + i];
        int keep = 1;
        for (int64_t e = 0; e < nk && keep; ++e) {
          const T* bk = cor + (b * n + kept[e]) * 4;
          const T ak = area[b * n + kept[e]];
          T d0 = (T)(KMIN(bi[2], bk[2]) - KMAX(bi[0], bk[0])), d1 = (T)(KMIN(bi[3], bk[3]) - KMAX(bi[1], bk[1]));
          d0 = d0 < (T)0 ? (T)0 : d0;
          d1 = d1 < (T)0 ? (T)0 : d1;
          volatile T inter = d0 * d1;
          volatile T uni = (T)(ai + ak) - inter;
          const T iou = (ai > (T)0 && ak > (T)0 && uni > (T)0) ? (T)(inter / uni) : (T)0;
          if (iou > iou_t) keep = 0;
        }
        if (!keep) continue;
        if (count >= cap) { free(cor); free(idx); KILN_FAIL(2, count + 1); }  /* capacity */
        kept[nk++] = i;
        out[3 * count] = b; out[3 * count + 1] = bc % nc; out[3 * count + 2] = i;
        ++count;
      }
    }
    free(cor); free(idx);
  }
  *selected = count;
  return 0;
}
#undef T
#undef KMIN
#undef KMAX
#undef BEFORE
