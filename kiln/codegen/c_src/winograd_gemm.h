/* The batched GEMM of the Winograd kernels (winograd.c, winograd1d.c), and (at the end) how
   they cut their work into tasks. The GEMM: for each of NP
   transform positions t, M[t] = V[t] U[t] over a chunk of T tiles and one group of OV output
   channel blocks, in register blocks of TR tiles x OV vectors with the input channels
   innermost (per channel, OV weight vectors and TR broadcasts for TR * OV FMAs). Instantiated
   per register tile: define before this file
     KILN_WGG_FN   the function's name
     KILN_WGG_L    the channel block = the vector lanes
     KILN_WGG_TR   tiles per register block
     KILN_WGG_OV   channel blocks per register block
     KILN_WGG_PF   floats ahead of each weight vector stream to prefetch (0: none)
     KILN_WGG_NX   1: each register block after a position's first hints one of the next
                   position's weight blocks into L2 (block j0 / TR mod OV; 0: none)
   u [NP][OCB][IC][L] transformed weights (this group's blocks start at og * OV), vbuf
   [NP][T][IC] transformed inputs, mbuf [NP][T][OV][L] out (planes kiln_wg_plane apart); T a multiple of TR; the GEMMs cover
   the chunk's first nt tiles rounded up to TR (a short last chunk computes no more). Always inlined:
   its loops unroll in the caller's as they did when they were written out there. */
#ifndef KILN_WG_ROUNDED_H
#define KILN_WG_ROUNDED_H
/* nt tiles rounded up to whole register blocks of TR: what a chunk's GEMMs compute */
static inline int64_t kiln_wg_rounded(int64_t nt, int64_t TR) { return (nt + TR - 1) / TR * TR; }
/* The stride, in floats, between the transform positions' planes of a buffer whose planes hold
   `floats`: whole 64-byte lines, an odd number of them. The transforms touch one vector in every
   plane; planes an even number of lines apart share few L1 sets (3 KiB apart, as a 12-tile chunk
   of 64 channels is, all 36 fall in 4 of the 64 sets of a 32 KiB 8-way L1) and evict each other. */
static inline int64_t kiln_wg_plane(int64_t floats) {
  const int64_t lines = (floats + 15) / 16;
  return (lines | 1) * 16;
}
#endif
static inline __attribute__((always_inline)) void KILN_WGG_FN(
    const float* restrict u, const float* restrict vbuf, float* restrict mbuf, int NP, int64_t OCB,
    int64_t og, int64_t T, int64_t nt, int64_t IC) {
  typedef float V __attribute__((vector_size(KILN_WGG_L * 4)));
  enum { L = KILN_WGG_L, TR = KILN_WGG_TR, OV = KILN_WGG_OV, PF = KILN_WGG_PF, NX = KILN_WGG_NX };
  const int64_t jn = kiln_wg_rounded(nt, TR);
  for (int t = 0; t < NP; ++t) {
    const float* ut = u + ((int64_t)t * OCB + og * OV) * IC * L;
    const float* vt = vbuf + (int64_t)t * kiln_wg_plane(T * IC);
    float* mt = mbuf + (int64_t)t * kiln_wg_plane(T * OV * L);
    for (int64_t j0 = 0; j0 < jn; j0 += TR) {
      V acc[TR][OV];
      #pragma GCC unroll 16
      for (int r = 0; r < TR; ++r)
        #pragma GCC unroll 8
        for (int o = 0; o < OV; ++o) acc[r][o] = (V){0};
      const float* vj = vt + j0 * IC;
      for (int64_t ic = 0; ic < IC; ++ic) {
        V wv[OV];
        #pragma GCC unroll 8
        for (int o = 0; o < OV; ++o) __builtin_memcpy(&wv[o], ut + (o * IC + ic) * L, sizeof(V));
        if (PF > 0) {   /* U streams from memory once per inference: asked for ahead (kiln.lower.winograd) */
          #pragma GCC unroll 8
          for (int o = 0; o < OV; ++o) __builtin_prefetch(ut + (o * IC + ic) * L + PF, 0, 3);
        }
        if (NX && t + 1 < NP)   /* the next position's, while this one's come from cache */
          __builtin_prefetch(ut + (OCB * IC + (j0 / TR % OV) * IC + ic) * L, 0, 2);
        #pragma GCC unroll 16
        for (int r = 0; r < TR; ++r) {
          const float s = vj[r * IC + ic];
          #pragma GCC unroll 8
          for (int o = 0; o < OV; ++o) acc[r][o] += s * wv[o];
        }
      }
      #pragma GCC unroll 16
      for (int r = 0; r < TR; ++r)
        #pragma GCC unroll 8
        for (int o = 0; o < OV; ++o) __builtin_memcpy(mt + ((j0 + r) * OV + o) * L, &acc[r][o], sizeof(V));
    }
  }
}
#ifndef KILN_WG_TASKS_H
#define KILN_WG_TASKS_H
/* How the Winograd kernels (winograd.c, winograd1d.c) cut their work into tasks: task `task`
   covers the chunk of T tiles from `first` (`nt` of them: the last chunk may be short) and
   part task % osplit of the output channel groups, [g0, g1). */
typedef struct { int64_t first, nt, g0, g1; } kiln_wg_task;
static inline kiln_wg_task kiln_wg_task_of(int64_t task, int64_t osplit, int64_t T, int64_t ntile,
                                           int64_t ngroup) {
  const int64_t part = task % osplit, first = task / osplit * T;
  const kiln_wg_task k = { first, ntile - first < T ? ntile - first : T, part * ngroup / osplit,
                           (part + 1) * ngroup / osplit };
  return k;
}
/* A range of tasks' own transform buffers, 64-byte aligned: vbuf [NP][T][IC] (the transformed
   inputs) and mbuf [NP][T][OVL] (the GEMMs' outputs), their planes kiln_wg_plane apart. Out of memory: none held, *failed set, 0. */
static inline int kiln_wg_buffers(float** vbuf, float** mbuf, int64_t NP, int64_t T, int64_t IC, int64_t OVL,
                                  int32_t* failed) {
  *vbuf = (float*)aligned_alloc(64, (size_t)NP * kiln_wg_plane(T * IC) * sizeof(float));
  *mbuf = (float*)aligned_alloc(64, (size_t)NP * kiln_wg_plane(T * OVL) * sizeof(float));
  if (*vbuf && *mbuf) return 1;
  free(*vbuf);
  free(*mbuf);
  *vbuf = *mbuf = NULL;
  __atomic_store_n(failed, 1, __ATOMIC_RELAXED);
  return 0;
}
/* A thread's transform buffers in one call of a Winograd kernel, kept over the ranges of tasks
   it takes (kiln_par_for hands a loop out in chunks of a few tasks; a thread that takes two
   parts of one chunk's output channels transforms its input once, where each range
   transformed it again), with the chunk whose transform vbuf holds (-1: none). `key`: the
   thread (the address of a thread-local byte), 0 for a free slot. */
typedef struct { uintptr_t key; float* vbuf; float* mbuf; int64_t held; } kiln_wg_slot;
#define KILN_WG_SLOTS 16
__attribute__((weak, visibility("hidden"))) __thread char kiln_wg_thread;
/* The calling thread's slot among `n` (claimed on its first range), or NULL when all are taken
   (more threads than slots: the range keeps buffers of its own). */
static inline kiln_wg_slot* kiln_wg_slot_of(kiln_wg_slot* slots, int32_t n) {
  const uintptr_t me = (uintptr_t)&kiln_wg_thread;
  for (int32_t i = 0; i < n; ++i) {
    uintptr_t seen = __atomic_load_n(&slots[i].key, __ATOMIC_ACQUIRE);
    if (seen == me) return &slots[i];
    if (seen == 0) {
      uintptr_t zero = 0;
      if (__atomic_compare_exchange_n(&slots[i].key, &zero, me, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        slots[i].held = -1;
        return &slots[i];
      }     /* (another thread took it: look on) */
    }
  }
  return NULL;
}
static inline void kiln_wg_slots_free(kiln_wg_slot* slots, int32_t n) {
  for (int32_t i = 0; i < n; ++i) {
    free(slots[i].vbuf);
    free(slots[i].mbuf);
  }
}
/* Whether tile j lies past the end (nt tiles) of a short last chunk; then its inputs are zeros
   at all NP positions (its register block reads them; callers stop at kiln_wg_rounded(nt, TR)). */
static inline int kiln_wg_past_end(float* vbuf, int64_t NP, int64_t T, int64_t j, int64_t nt, int64_t IC) {
  if (j < nt) return 0;
  for (int64_t t = 0; t < NP; ++t) __builtin_memset(vbuf + t * kiln_wg_plane(T * IC) + j * IC, 0, IC * sizeof(float));
  return 1;
}
#endif
