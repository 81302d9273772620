/* Winograd F(4x4, 3x3) or F(2x2, 3x3) convolution on the blocked layout: the kernel behind
   kiln.lower.winograd (the op and its transform matrices: kiln.ops.winograd). Instantiated per
   output tile and register tile: define before this file
     KILN_WG_M    the output tile, 4 or 2 (MT below; NT = MT + 2 the input tile, NP = NT^2 the
                  transform positions: 36 or 16)
     KILN_WG_FN   the function's name
     KILN_WG_GEMM the name of its batched GEMM (winograd_gemm.h, instantiated before it)
     KILN_WG_L    the channel block = the vector lanes (8 with AVX2, 16 with AVX-512)
     KILN_WG_TR   tiles per register block       } KILN_WG_TR * KILN_WG_OV accumulators stay
     KILN_WG_OV   channel blocks per register block } in vector registers over the input channels

   x [N][ICB][H][W][L] blocked input; u [NP][OCB][ICB*L][L] transformed weights (position,
   output block, input channel, the block's output channels); bias [OCB][L] or NULL;
   y [N][OCB][OH][OW][L]. An MT x MT output tile reads the NT x NT input tile under it (zero
   outside the input: the padding). Tiles are numbered over (image, tile row, tile column).

   Work goes in tasks: a chunk of T tiles (a multiple of TR) and a part of the output channel
   blocks (`osplit` parts, so that a small image still gives every thread work). A task
     1. transforms its tiles' inputs, all input channels: V[t][tile][ic] = (B^T d B)[t]
        (T * NP * IC floats, sized by the caller to stay in L2),
     2. per group of OV output channel blocks: the NP GEMMs M[t] = V[t] U[t] over the chunk
        (register blocks of TR tiles x OV vectors, input channels innermost: per channel, OV
        weight vectors and TR broadcasts for TR * OV FMAs), then the output transform
        A^T M A of each tile, + bias, the activation `act` (1 ReLU; 2 Swish, v sigmoid(v) by
        kiln_sigmoid.h, included before this file; 0 none), stored into y (cropped at the edges).
   Tasks run in parallel (`par`: kiln_par_for, on the module's threads, a few tasks a range), each
   thread with transform buffers of its own for the call (kiln_wg_slot, winograd_gemm.h): a thread
   that takes two parts of one chunk in two ranges transforms its input once. Returns 0, or -1
   when out of memory.

   A shared kernel (kiln.codegen.csource.c_shared): the sizes are arguments, so one instance
   serves every layer of every model with the same register tile; it is compiled once, in a
   translation unit of its own, and kept in the per-machine object cache. */
__attribute__((visibility("hidden"))) int32_t KILN_WG_FN(
    const float* restrict x, const float* restrict u, const float* restrict bias, float* restrict y,
    int64_t N, int64_t ICB, int64_t H, int64_t W, int64_t OCB, int64_t OH, int64_t OW,
    int64_t pt, int64_t pl, int64_t T, int64_t osplit, int act, int par);
/* kiln: definition */
#define KILN_WG_CAT2(a, b) a##b
#define KILN_WG_CAT(a, b) KILN_WG_CAT2(a, b)
#define KILN_WG_CTX KILN_WG_CAT(KILN_WG_FN, _ctx)
#define KILN_WG_TASKS KILN_WG_CAT(KILN_WG_FN, _tasks)
/* what a range of tasks reads (kiln_par_for's context), and each thread's transform buffers
   (kiln_wg_slot: kept over the ranges a thread takes in one call) */
struct KILN_WG_CTX {
  const float* x; const float* u; const float* bias; float* y;
  int64_t N, ICB, H, W, OCB, OH, OW, pt, pl, T, osplit;
  int act; int32_t failed;
  kiln_wg_slot* slots; int32_t nslots;
};
/* tasks [lo, hi), with this thread's transform buffers */
static void KILN_WG_TASKS(void* ctx_, int64_t lo, int64_t hi) {
  const struct KILN_WG_CTX* c = (const struct KILN_WG_CTX*)ctx_;
  const float* restrict x = c->x; const float* restrict u = c->u; const float* restrict bias = c->bias;
  float* restrict y = c->y;
  const int64_t ICB = c->ICB, H = c->H, W = c->W, OCB = c->OCB, OH = c->OH, OW = c->OW, pt = c->pt, pl = c->pl;
  const int64_t T = c->T, osplit = c->osplit, N = c->N;
  const int act = c->act;
  typedef float V __attribute__((vector_size(KILN_WG_L * 4)));
  typedef int32_t VI __attribute__((vector_size(KILN_WG_L * 4)));
#define WG_LD(p) ({ V v_; __builtin_memcpy(&v_, (p), sizeof v_); v_; })
#define WG_ST(p, v) do { V v_ = (v); __builtin_memcpy((p), &v_, sizeof v_); } while (0)
/* B^T applied to d0..d5 (one row or column of a tile) -> o0..o5 */
#define WG_BT(d0, d1, d2, d3, d4, d5, o0, o1, o2, o3, o4, o5) do { \
    const V a_ = (d4) - 4.0f * (d2), b_ = (d3) - 4.0f * (d1); \
    const V c_ = (d4) - (d2), e_ = 2.0f * ((d3) - (d1)); \
    o0 = 4.0f * (d0) - 5.0f * (d2) + (d4); \
    o1 = a_ + b_; o2 = a_ - b_; o3 = c_ + e_; o4 = c_ - e_; \
    o5 = 4.0f * (d1) - 5.0f * (d3) + (d5); } while (0)
/* A^T applied to m0..m5 -> o0..o3 */
#define WG_AT(m0, m1, m2, m3, m4, m5, o0, o1, o2, o3) do { \
    const V s12_ = (m1) + (m2), d12_ = (m1) - (m2), s34_ = (m3) + (m4), d34_ = (m3) - (m4); \
    o0 = (m0) + s12_ + s34_; o1 = d12_ + 2.0f * d34_; \
    o2 = s12_ + 4.0f * s34_; o3 = d12_ + 8.0f * d34_ + (m5); } while (0)
#if KILN_WG_M == 4
/* over arrays: B^T of d[0..5] -> o[0..5], A^T of m[0..5] -> o[0..3] */
#define WG_BTA(d, o) WG_BT((d)[0], (d)[1], (d)[2], (d)[3], (d)[4], (d)[5], (o)[0], (o)[1], (o)[2], (o)[3], (o)[4], (o)[5])
#define WG_ATA(m, o) WG_AT((m)[0], (m)[1], (m)[2], (m)[3], (m)[4], (m)[5], (o)[0], (o)[1], (o)[2], (o)[3])
#elif KILN_WG_M == 2
/* F(2x2, 3x3) over the points 0, 1, -1 and infinity (kiln.ops.winograd.matrices(2)):
   B^T of d[0..3] -> o[0..3], A^T of m[0..3] -> o[0..1] */
#define WG_BTA(d, o) do { (o)[0] = (d)[2] - (d)[0]; (o)[1] = (d)[1] + (d)[2]; \
    (o)[2] = (d)[2] - (d)[1]; (o)[3] = (d)[3] - (d)[1]; } while (0)
#define WG_ATA(m, o) do { (o)[0] = (m)[0] + (m)[1] + (m)[2]; (o)[1] = (m)[1] - (m)[2] + (m)[3]; } while (0)
#else
#error "KILN_WG_M must be 4 or 2"
#endif
  enum { L = KILN_WG_L, TR = KILN_WG_TR, OV = KILN_WG_OV, MT = KILN_WG_M, NT = MT + 2, NP = NT * NT };
  const int64_t IC = ICB * L;
  const int64_t TH = (OH + MT - 1) / MT, TW = (OW + MT - 1) / MT, per_image = TH * TW, ntile = N * per_image;
  const int64_t ngroup = OCB / OV;
  float *vbuf, *mbuf;   /* the buffers and the tasks: winograd_gemm.h */
  /* this thread's buffers in this call (another range it ran may have left a chunk's transform
     in them), or a range's own where the slots are taken */
  kiln_wg_slot* slot = kiln_wg_slot_of(c->slots, c->nslots);
  if (slot && !slot->vbuf && !kiln_wg_buffers(&slot->vbuf, &slot->mbuf, NP, T, IC, OV * L,
                                              &((struct KILN_WG_CTX*)ctx_)->failed)) return;
  if (!slot && !kiln_wg_buffers(&vbuf, &mbuf, NP, T, IC, OV * L, &((struct KILN_WG_CTX*)ctx_)->failed)) return;
  if (slot) { vbuf = slot->vbuf; mbuf = slot->mbuf; }
  const int64_t pv = kiln_wg_plane(T * IC), pm = kiln_wg_plane(T * OV * L);   /* plane strides */
  int64_t held = slot ? slot->held : -1;   /* the chunk (first tile) whose transformed input vbuf holds */
  for (int64_t task = lo; task < hi; ++task) {
    const kiln_wg_task k_ = kiln_wg_task_of(task, osplit, T, ntile, ngroup);
    const int64_t first = k_.first, nt = k_.nt;
    /* 1. input transform (a short last chunk: up to whole register blocks), unless the range's
       previous task was another part of the same chunk: steps 2 and 3 leave vbuf as it was */
    for (int64_t j = 0; first != held && j < kiln_wg_rounded(nt, TR); ++j) {
      if (kiln_wg_past_end(vbuf, NP, T, j, nt, IC)) continue;
      const int64_t g = first + j, n = g / per_image, r = g % per_image;
      const int64_t iy0 = r / TW * MT - pt, ix0 = r % TW * MT - pl;
      const int inside = iy0 >= 0 && iy0 + NT <= H && ix0 >= 0 && ix0 + NT <= W;
      for (int64_t cb = 0; cb < ICB; ++cb) {
        const float* xc = x + (n * ICB + cb) * H * W * L;
        V d[NT][NT], tm[NT][NT];
        if (inside) {
          #pragma GCC unroll 6
          for (int i = 0; i < NT; ++i)
            #pragma GCC unroll 6
            for (int k = 0; k < NT; ++k) d[i][k] = WG_LD(xc + ((iy0 + i) * W + ix0 + k) * L);
        } else {
          for (int i = 0; i < NT; ++i)
            for (int k = 0; k < NT; ++k) {
              const int64_t iy = iy0 + i, ix = ix0 + k;
              d[i][k] = (iy >= 0 && iy < H && ix >= 0 && ix < W) ? WG_LD(xc + (iy * W + ix) * L) : (V){0};
            }
        }
        #pragma GCC unroll 6
        for (int k = 0; k < NT; ++k) {
          V col[NT], tc[NT];
          #pragma GCC unroll 6
          for (int i = 0; i < NT; ++i) col[i] = d[i][k];
          WG_BTA(col, tc);
          #pragma GCC unroll 6
          for (int i = 0; i < NT; ++i) tm[i][k] = tc[i];
        }
        #pragma GCC unroll 6
        for (int a = 0; a < NT; ++a) {
          V o[NT];
          WG_BTA(tm[a], o);
          for (int b = 0; b < NT; ++b) WG_ST(vbuf + (a * NT + b) * pv + j * IC + cb * L, o[b]);
        }
      }
    }
    held = first;
    for (int64_t og = k_.g0; og < k_.g1; ++og) {
      /* 2. the NP GEMMs of this group of output channel blocks (winograd_gemm.h) */
      KILN_WG_GEMM(u, vbuf, mbuf, NP, OCB, og, T, nt, IC);
      /* 3. output transform */
      for (int64_t j = 0; j < nt; ++j) {
        const int64_t g = first + j, n = g / per_image, r = g % per_image;
        const int64_t oy0 = r / TW * MT, ox0 = r % TW * MT;
        const int rows = OH - oy0 < MT ? (int)(OH - oy0) : MT, cols = OW - ox0 < MT ? (int)(OW - ox0) : MT;
        for (int o = 0; o < OV; ++o) {
          const int64_t ocb = og * OV + o;
          V mm[NT][NT], tm[MT][NT];
          for (int a = 0; a < NT; ++a)
            for (int b = 0; b < NT; ++b) mm[a][b] = WG_LD(mbuf + (a * NT + b) * pm + (j * OV + o) * L);
          for (int b = 0; b < NT; ++b) {
            V col[NT], tc[MT];
            for (int a = 0; a < NT; ++a) col[a] = mm[a][b];
            WG_ATA(col, tc);
            for (int a = 0; a < MT; ++a) tm[a][b] = tc[a];
          }
          const V bv = bias ? WG_LD(bias + ocb * L) : (V){0};
          float* yo = y + ((n * OCB + ocb) * OH + oy0) * OW * L + ox0 * L;
          for (int i = 0; i < rows; ++i) {
            V out[MT];
            WG_ATA(tm[i], out);
            for (int k = 0; k < cols; ++k) {
              V v = out[k] + bv;
              if (act == 1) v = (V)((VI)v & ~(VI)(v < (V){0}));   /* max(v, 0); a NaN stays NaN */
              WG_ST(yo + (i * OW + k) * L, v);
            }
            if (act == 2) {                      /* v * sigmoid(v) over the row's stored vectors */
              float* restrict yr = yo + i * OW * L;
              #pragma omp simd
              for (int e = 0; e < cols * L; ++e) yr[e] = yr[e] * kiln_sigmoid_f32(yr[e]);
            }
          }
        }
      }
    }
  }
  if (slot) {
    slot->held = held;
  } else {
    free(vbuf);
    free(mbuf);
  }
#undef WG_LD
#undef WG_ST
#undef WG_BT
#undef WG_AT
#undef WG_BTA
#undef WG_ATA
}

__attribute__((weak, visibility("hidden"), noinline)) int32_t KILN_WG_FN(
    const float* restrict x, const float* restrict u, const float* restrict bias, float* restrict y,
    int64_t N, int64_t ICB, int64_t H, int64_t W, int64_t OCB, int64_t OH, int64_t OW,
    int64_t pt, int64_t pl, int64_t T, int64_t osplit, int act, int par) {
  const int64_t ntile = N * ((OH + KILN_WG_M - 1) / KILN_WG_M) * ((OW + KILN_WG_M - 1) / KILN_WG_M);
  kiln_wg_slot slots[KILN_WG_SLOTS] = {{0}};
  struct KILN_WG_CTX c = { x, u, bias, y, N, ICB, H, W, OCB, OH, OW, pt, pl, T, osplit, act, 0, slots, KILN_WG_SLOTS };
  kiln_par_for(KILN_WG_TASKS, &c, 0, (ntile + T - 1) / T * osplit, par);
  kiln_wg_slots_free(slots, KILN_WG_SLOTS);
  return c.failed ? -1 : 0;
}
#undef KILN_WG_TASKS
#undef KILN_WG_CTX
#undef KILN_WG_CAT
#undef KILN_WG_CAT2
