/* Winograd F(m, r) 1-D convolution on the blocked layout, dilated or strided: the kernel behind
   kiln.lower.winograd1d (the op and its transform matrices: kiln.ops.winograd1d,
   kiln.ops.winograd.matrices). Instantiated per tile size and register tile: define before this file
     KILN_WG1_FN   the function's name
     KILN_WG1_GEMM the name of its batched GEMM (winograd_gemm.h, instantiated before it)
     KILN_WG1_L    the channel block = the vector lanes (8 with AVX2, 16 with AVX-512)
     KILN_WG1_M    outputs per tile (m)
     KILN_WG1_R    taps per phase (r); a tile reads KILN_WG1_M + KILN_WG1_R - 1 inputs
     KILN_WG1_AT   A^T [m][m+r-1] and B^T [m+r-1][m+r-1] as brace initializers (exact small
     KILN_WG1_BT   rationals: their zeros and ones fold away when the loops unroll)
     KILN_WG1_TR   tiles per register block       } KILN_WG1_TR * KILN_WG1_OV accumulators stay
     KILN_WG1_OV   channel blocks per register block } in vector registers over the input channels

   x [N][ICB][W][L] blocked input (a 1-D N,C,W tensor blocked as N,ICB,1,W,L); u [m+r-1][OCB][ICB*S*L][L]
   transformed weights (position, output block, input channel and phase, the block's output
   channels); bias [OCB][L] or NULL; y [N][OCB][OW][L]. Output o reads inputs S*o - pl + k*dil
   (zero outside the input: the padding), S > 1 only with dil = 1.
   Dilated: outputs o = p + dil * q of one phase p < dil form an undilated correlation over q,
   so a tile is m outputs q = m*i .. m*i + m-1 of one phase, and it reads the m + r - 1 inputs
   under them, dil apart. Strided: input phase p < S of channel c, x_p[i] = x[S*i + p - pl], is
   one more input channel (c, p) of a stride-1 correlation with the taps k = S*j + p, j < r
   (polyphase: an 8-tap stride-4 conv is a 2-tap stride-1 one over 4x the channels), so its
   reduction runs over ICB*S*L values (channel block, phase, lane). Tiles are numbered over
   (image, output phase, i).

   Work goes in tasks, as in winograd.c: a chunk of T tiles (a multiple of TR) and a part of the
   output channel blocks (`osplit` parts). A task
     1. transforms its tiles' inputs, all input channels (and phases): V[t][tile][ic] = (B^T d)[t],
     2. per group of OV output channel blocks: the m + r - 1 GEMMs M[t] = V[t] U[t] over the chunk
        (register blocks of TR tiles x OV vectors, input channels innermost), then the output
        transform A^T M of each tile, + bias, ReLU when asked, stored into y (cropped at the end).
   Tasks run in parallel (`par`: kiln_par_for, on the module's threads), each range of them with
   transform buffers of its own. Returns 0, or -1 when out of memory. */
#define KILN_WG1_CAT2(a, b) a##b
#define KILN_WG1_CAT(a, b) KILN_WG1_CAT2(a, b)
#define KILN_WG1_CTX KILN_WG1_CAT(KILN_WG1_FN, _ctx)
#define KILN_WG1_TASKS KILN_WG1_CAT(KILN_WG1_FN, _tasks)
/* what a range of tasks reads (kiln_par_for's context) */
struct KILN_WG1_CTX {
  const float* x; const float* u; const float* bias; float* y;
  int64_t N, ICB, W, OCB, OW, pl, dil, S, T, osplit;
  int relu; int32_t failed;
};
/* tasks [lo, hi), with transform buffers of their own */
static void KILN_WG1_TASKS(void* ctx_, int64_t lo, int64_t hi) {
  const struct KILN_WG1_CTX* c = (const struct KILN_WG1_CTX*)ctx_;
  const float* restrict x = c->x; const float* restrict u = c->u; const float* restrict bias = c->bias;
  float* restrict y = c->y;
  const int64_t N = c->N, ICB = c->ICB, W = c->W, OCB = c->OCB, OW = c->OW, pl = c->pl, dil = c->dil, S = c->S;
  const int64_t T = c->T, osplit = c->osplit;
  const int relu = c->relu;
  typedef float V __attribute__((vector_size(KILN_WG1_L * 4)));
  typedef int32_t VI __attribute__((vector_size(KILN_WG1_L * 4)));
#define WG1_LD(p) ({ V v_; __builtin_memcpy(&v_, (p), sizeof v_); v_; })
#define WG1_ST(p, v) do { V v_ = (v); __builtin_memcpy((p), &v_, sizeof v_); } while (0)
  enum { L = KILN_WG1_L, M = KILN_WG1_M, NT = KILN_WG1_M + KILN_WG1_R - 1, TR = KILN_WG1_TR, OV = KILN_WG1_OV };
  static const float AT[M][NT] = KILN_WG1_AT;
  static const float BT[NT][NT] = KILN_WG1_BT;
  const int64_t IC = ICB * S * L, step = S * dil;   /* the reduction: channel block, phase, lane */
  const int64_t per_phase = ((OW + dil - 1) / dil + M - 1) / M;      /* tiles of one phase */
  const int64_t per_image = dil * per_phase, ntile = N * per_image;
  const int64_t ngroup = OCB / OV;
  float *vbuf, *mbuf;   /* the buffers and the tasks: winograd_gemm.h */
  if (!kiln_wg_buffers(&vbuf, &mbuf, NT, T, IC, OV * L, &((struct KILN_WG1_CTX*)ctx_)->failed)) return;
  const int64_t pv = kiln_wg_plane(T * IC), pm = kiln_wg_plane(T * OV * L);   /* plane strides */
  for (int64_t task = lo; task < hi; ++task) {
    const kiln_wg_task k_ = kiln_wg_task_of(task, osplit, T, ntile, ngroup);
    const int64_t first = k_.first, nt = k_.nt;
    /* 1. input transform */
    for (int64_t j = 0; j < kiln_wg_rounded(nt, TR); ++j) {
      if (kiln_wg_past_end(vbuf, NT, T, j, nt, IC)) continue;
      const int64_t g = first + j, n = g / per_image, r = g % per_image;
      const int64_t xs = S * (r / per_phase + dil * M * (r % per_phase)) - pl;
      for (int64_t cp = 0; cp < ICB * S; ++cp) {
        const int64_t cb = cp / S, x0 = xs + cp % S;
        const int inside = x0 >= 0 && x0 + step * (NT - 1) < W;
        const float* xc = x + (n * ICB + cb) * W * L;
        V d[NT];
        if (inside) {
          #pragma GCC unroll 16
          for (int k = 0; k < NT; ++k) d[k] = WG1_LD(xc + (x0 + step * k) * L);
        } else {
          for (int k = 0; k < NT; ++k) {
            const int64_t ix = x0 + step * k;
            d[k] = (ix >= 0 && ix < W) ? WG1_LD(xc + ix * L) : (V){0};
          }
        }
        #pragma GCC unroll 16
        for (int a = 0; a < NT; ++a) {
          V o = (V){0};
          int none = 1;              /* the first term starts the sum (0 + v is no fold) */
          #pragma GCC unroll 16
          for (int k = 0; k < NT; ++k)
            if (BT[a][k] != 0.0f) {
              const V t_ = BT[a][k] * d[k];
              o = none ? t_ : o + t_;
              none = 0;
            }
          WG1_ST(vbuf + a * pv + j * IC + cp * L, o);
        }
      }
    }
    for (int64_t og = k_.g0; og < k_.g1; ++og) {
      /* 2. the m + r - 1 GEMMs of this group of output channel blocks (winograd_gemm.h) */
      KILN_WG1_GEMM(u, vbuf, mbuf, NT, OCB, og, T, nt, IC);
      /* 3. output transform */
      for (int64_t j = 0; j < nt; ++j) {
        const int64_t g = first + j, n = g / per_image, r = g % per_image;
        const int64_t o0 = r / per_phase + dil * M * (r % per_phase);
        for (int o = 0; o < OV; ++o) {
          const int64_t ocb = og * OV + o;
          V mm[NT];
          #pragma GCC unroll 16
          for (int a = 0; a < NT; ++a) mm[a] = WG1_LD(mbuf + a * pm + (j * OV + o) * L);
          const V bv = bias ? WG1_LD(bias + ocb * L) : (V){0};
          float* yo = y + (n * OCB + ocb) * OW * L;
          #pragma GCC unroll 16
          for (int k = 0; k < M; ++k) {
            const int64_t oo = o0 + dil * k;
            if (oo >= OW) break;
            V v = bv;
            #pragma GCC unroll 16
            for (int a = 0; a < NT; ++a)
              if (AT[k][a] != 0.0f) v += AT[k][a] * mm[a];
            if (relu) v = (V)((VI)v & ~(VI)(v < (V){0}));   /* max(v, 0); a NaN stays NaN */
            WG1_ST(yo + oo * L, v);
          }
        }
      }
    }
  }
  free(vbuf);
  free(mbuf);
#undef WG1_LD
#undef WG1_ST
}

__attribute__((noinline)) static int32_t KILN_WG1_FN(
    const float* restrict x, const float* restrict u, const float* restrict bias, float* restrict y,
    int64_t N, int64_t ICB, int64_t W, int64_t OCB, int64_t OW, int64_t pl, int64_t dil, int64_t S,
    int64_t T, int64_t osplit, int relu, int par) {
  const int64_t per_phase = ((OW + dil - 1) / dil + KILN_WG1_M - 1) / KILN_WG1_M, ntile = N * dil * per_phase;
  struct KILN_WG1_CTX c = { x, u, bias, y, N, ICB, W, OCB, OW, pl, dil, S, T, osplit, relu, 0 };
  kiln_par_for(KILN_WG1_TASKS, &c, 0, (ntile + T - 1) / T * osplit, par);
  return c.failed ? -1 : 0;
}
#undef KILN_WG1_TASKS
#undef KILN_WG1_CTX
#undef KILN_WG1_CAT
#undef KILN_WG1_CAT2
