/* kiln's tree-ensemble engine (ai.onnx.ml TreeEnsemble*, see kiln/ops/ml_trees.py).

   A forest is packed per tree into node records {threshold, feature, child[2]}: an
   internal node goes to child[0] when its test holds (the "true" branch) and to
   child[1] otherwise; a leaf is a record whose two children are itself. One step is
   then `i = nd[i].ch[!(x[f] <= t)]`, a load and an indexed load with no branch, and
   a leaf stays put, so several rows walk one tree in lock step (KILN_TREE_LANES
   independent load chains at once) until none moves. Trees other than all-LEQ without
   missing-value tracks read a mode byte per node (the generic step).

   A batch of fewer than 4 rows walks 8 trees at once per row instead (the lanes take trees).
   Rows are cut in blocks; a block walks every tree in order, so each row's scores
   are summed in tree order (the order ONNX Runtime sums in, which keeps labels at
   exact ties equal), and the tree's nodes stay in cache across the block's rows.
   Blocks run in parallel; with few rows and much work the trees run in parallel
   instead, each writing the leaf it reaches, summed in tree order afterwards. */

#ifndef KILN_ML_TREES_C
#define KILN_ML_TREES_C
#ifdef _OPENMP
#include <omp.h>
#endif

/* The tables come as byte strings (see ml_common.c_blob) and are read through these
   types: may_alias tells the compiler so (reading a char array as int32 is otherwise
   undefined behaviour). */
typedef int32_t __attribute__((may_alias)) kiln_a_i32;
typedef float __attribute__((may_alias)) kiln_a_f32;
typedef double __attribute__((may_alias)) kiln_a_f64;

#define KILN_TREE_LANES 8
#define KILN_TREE_BLOCK 128

static inline int kiln_tree_threads(void) {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

#define KILN_FOREST(S, T)                                                                        \
typedef struct { T t; int32_t f; int32_t ch[2]; } __attribute__((may_alias)) kiln_tn_##S;        \
typedef struct {                                                                                 \
  const kiln_tn_##S* nd;      /* node records, tree after tree */                                \
  const kiln_a_i32* root;        /* per tree: its root record */                                    \
  const kiln_a_i32* depth;       /* per tree: the most steps from root to a leaf */                 \
  int64_t ntrees, work;       /* work: the sum of depths, steps per row at most */               \
  const uint8_t* mode;        /* per record: mode (0..6) | 8 if NaN goes true; NULL: all LEQ */  \
  const kiln_a_i32* mstart;      /* BRANCH_MEMBER: per record, its sorted values in mval */         \
  const kiln_a_##S* mval;                                                                                 \
  const kiln_a_i32* lstart;      /* per record: its leaf contributions (CSR) */                     \
  const kiln_a_i32* ltgt;                                                                           \
  const kiln_a_##S* lw;                                                                                   \
  int64_t ntargets;                                                                              \
  int agg;                    /* 0 AVERAGE, 1 SUM, 2 MIN, 3 MAX */                               \
} kiln_forest_##S;                                                                               \
                                                                                                 \
static inline int32_t kiln_tree_step_##S(const kiln_forest_##S* F, int32_t i, const T* x) {     \
  const kiln_tn_##S* n = F->nd + i;                                                              \
  const T v = x[n->f], s = n->t;                                                                 \
  const uint8_t m = F->mode[i];                                                                  \
  int go;                                                                                        \
  switch (m & 7) {                                                                               \
    case 0: go = v <= s; break;                                                                  \
    case 1: go = v < s; break;                                                                   \
    case 2: go = v >= s; break;                                                                  \
    case 3: go = v > s; break;                                                                   \
    case 4: go = v == s; break;                                                                  \
    case 5: go = v != s; break;                                                                  \
    default: {                                                                                   \
      int32_t lo = F->mstart[i], hi = F->mstart[i + 1];                                          \
      const int32_t end = hi;                                                                    \
      while (lo < hi) { const int32_t mid = lo + (hi - lo) / 2;                                  \
                        if (F->mval[mid] < v) lo = mid + 1; else hi = mid; }                     \
      go = lo < end && F->mval[lo] == v;                                                         \
    }                                                                                            \
  }                                                                                              \
  if ((m & 8) && v != v) go = 1;                                                                 \
  return n->ch[!go];                                                                             \
}                                                                                                \
                                                                                                 \
/* the leaf record each of nb rows (x, row stride width) reaches in tree `tree` */              \
static inline void kiln_tree_walk_##S(const kiln_forest_##S* F, int64_t tree, const T* x,       \
                                      int64_t width, int nb, int32_t* leaf) {                    \
  const int32_t r = F->root[tree], d = F->depth[tree];                                           \
  int32_t id[KILN_TREE_LANES];                                                                   \
  for (int b = 0; b < nb; ++b) id[b] = r;                                                        \
  if (!F->mode) {                                                                                \
    const kiln_tn_##S* nd = F->nd;                                                               \
    for (int32_t s = 0; s < d; ++s) {                                                            \
      int moved = 0;                                                                             \
      for (int b = 0; b < nb; ++b) {                                                             \
        const kiln_tn_##S* n = nd + id[b];                                                       \
        const int32_t nx = n->ch[!(x[b * width + n->f] <= n->t)];                                \
        moved |= nx != id[b];                                                                    \
        id[b] = nx;                                                                              \
      }                                                                                          \
      if (!moved) break;                                                                         \
    }                                                                                            \
  } else {                                                                                       \
    for (int32_t s = 0; s < d; ++s) {                                                            \
      int moved = 0;                                                                             \
      for (int b = 0; b < nb; ++b) {                                                             \
        const int32_t nx = kiln_tree_step_##S(F, id[b], x + b * width);                          \
        moved |= nx != id[b];                                                                    \
        id[b] = nx;                                                                              \
      }                                                                                          \
      if (!moved) break;                                                                         \
    }                                                                                            \
  }                                                                                              \
  for (int b = 0; b < nb; ++b) leaf[b] = id[b];                                                  \
}                                                                                                \
                                                                                                 \
/* the leaf record one row (x) reaches in each of trees t0 .. t0+nb-1: the lanes walk     \
   several trees at once, for batches too small to fill them with rows */                       \
static inline void kiln_tree_walk_trees_##S(const kiln_forest_##S* F, int64_t t0, int nb,       \
                                            const T* x, int32_t* leaf) {                         \
  int32_t id[KILN_TREE_LANES], d = 0;                                                            \
  for (int b = 0; b < nb; ++b) {                                                                 \
    id[b] = F->root[t0 + b];                                                                     \
    d = F->depth[t0 + b] > d ? F->depth[t0 + b] : d;                                             \
  }                                                                                              \
  const kiln_tn_##S* nd = F->nd;                                                                 \
  for (int32_t s = 0; s < d; ++s) {                                                              \
    int moved = 0;                                                                               \
    for (int b = 0; b < nb; ++b) {                                                               \
      int32_t nx;                                                                                \
      if (!F->mode) { const kiln_tn_##S* n = nd + id[b]; nx = n->ch[!(x[n->f] <= n->t)]; }       \
      else nx = kiln_tree_step_##S(F, id[b], x);                                                 \
      moved |= nx != id[b];                                                                      \
      id[b] = nx;                                                                                \
    }                                                                                            \
    if (!moved) break;                                                                           \
  }                                                                                              \
  for (int b = 0; b < nb; ++b) leaf[b] = id[b];                                                  \
}                                                                                                \
                                                                                                 \
static inline void kiln_tree_add_##S(const kiln_forest_##S* F, int32_t n, T* a, uint8_t* h) {    \
  for (int32_t e = F->lstart[n]; e < F->lstart[n + 1]; ++e) {                                    \
    const int32_t tg = F->ltgt[e];                                                               \
    const T w = F->lw[e];                                                                        \
    if (F->agg <= 1) a[tg] += w;                                                                 \
    else if (F->agg == 2) { if (!h[tg] || w < a[tg]) a[tg] = w; }                                \
    else { if (!h[tg] || w > a[tg]) a[tg] = w; }                                                 \
    h[tg] = 1;                                                                                   \
  }                                                                                              \
}                                                                                                \
                                                                                                 \
static void kiln_forest_block_##S(const kiln_forest_##S* F, const T* x, int64_t width,          \
                                  int64_t r0, int64_t r1, T* acc, uint8_t* has) {                \
  int32_t leaf[KILN_TREE_LANES];                                                                 \
  const int64_t nt = F->ntargets;                                                                \
  if (r1 - r0 < KILN_TREE_LANES / 2) {  /* few rows: the lanes take trees */                     \
    for (int64_t r = r0; r < r1; ++r)                                                            \
      for (int64_t t = 0; t < F->ntrees; t += KILN_TREE_LANES) {                                 \
        const int nb = (int)(F->ntrees - t < KILN_TREE_LANES ? F->ntrees - t : KILN_TREE_LANES); \
        kiln_tree_walk_trees_##S(F, t, nb, x + r * width, leaf);                                 \
        for (int b = 0; b < nb; ++b) kiln_tree_add_##S(F, leaf[b], acc + r * nt, has + r * nt);  \
      }                                                                                          \
    return;                                                                                      \
  }                                                                                              \
  for (int64_t t = 0; t < F->ntrees; ++t)                                                        \
    for (int64_t r = r0; r < r1; r += KILN_TREE_LANES) {                                         \
      const int nb = (int)(r1 - r < KILN_TREE_LANES ? r1 - r : KILN_TREE_LANES);                 \
      kiln_tree_walk_##S(F, t, x + r * width, width, nb, leaf);                                  \
      for (int b = 0; b < nb; ++b) kiln_tree_add_##S(F, leaf[b], acc + (r + b) * nt,             \
                                                     has + (r + b) * nt);                        \
    }                                                                                            \
}                                                                                                \
                                                                                                 \
/* acc/has [rows, ntargets]: each row's combined leaf weights (0 if none) and whether any leaf fed it */    \
static int kiln_forest_eval_##S(const kiln_forest_##S* F, const T* x, int64_t rows,              \
                                int64_t width, T* acc, uint8_t* has) {                           \
  for (int64_t i = 0; i < rows * F->ntargets; ++i) { acc[i] = 0; has[i] = 0; }                   \
  const int threads = kiln_tree_threads();                                                       \
  const int64_t work = rows * F->work;                                                           \
  if (threads > 1 && rows < 2 * KILN_TREE_LANES && F->ntrees >= 2 * threads && work >= 20000) {  \
    int32_t* leaf = (int32_t*)malloc(sizeof(int32_t) * (size_t)(rows * F->ntrees));              \
    if (!leaf) return -1;                                                                        \
    _Pragma("omp parallel for schedule(static)")                                                 \
    for (int64_t t = 0; t < F->ntrees; ++t)                                                      \
      for (int64_t r = 0; r < rows; r += KILN_TREE_LANES) {                                      \
        int32_t l[KILN_TREE_LANES];                                                              \
        const int nb = (int)(rows - r < KILN_TREE_LANES ? rows - r : KILN_TREE_LANES);           \
        kiln_tree_walk_##S(F, t, x + r * width, width, nb, l);                                   \
        for (int b = 0; b < nb; ++b) leaf[(r + b) * F->ntrees + t] = l[b];                       \
      }                                                                                          \
    for (int64_t r = 0; r < rows; ++r)                                                           \
      for (int64_t t = 0; t < F->ntrees; ++t)                                                    \
        kiln_tree_add_##S(F, leaf[r * F->ntrees + t], acc + r * F->ntargets, has + r * F->ntargets); \
    free(leaf);                                                                                  \
    return 0;                                                                                    \
  }                                                                                              \
  int64_t block = KILN_TREE_BLOCK;                                                               \
  if (threads > 1 && rows < block * threads) {  /* every thread gets a block */                  \
    block = (rows + threads - 1) / threads;                                                      \
    block = (block + KILN_TREE_LANES - 1) / KILN_TREE_LANES * KILN_TREE_LANES;                   \
  }                                                                                              \
  const int64_t nblocks = (rows + block - 1) / block;                                            \
  _Pragma("omp parallel for schedule(dynamic, 1) if (nblocks > 1 && work >= 20000)")             \
  for (int64_t k = 0; k < nblocks; ++k) {                                                        \
    const int64_t r0 = k * block, r1 = r0 + block < rows ? r0 + block : rows;                    \
    kiln_forest_block_##S(F, x, width, r0, r1, acc, has);                                        \
  }                                                                                              \
  return 0;                                                                                      \
}

KILN_FOREST(f32, float)
KILN_FOREST(f64, double)
#endif
