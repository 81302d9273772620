/* kiln::FusedAttention, the kernel behind kiln.lower.fused_attention: softmax(Q·Kᵀ·scale +
   mask)·V in the style of FlashAttention for CPUs. Q is tiled (BQ query rows per task),
   K and V are streamed in blocks of BK keys, the softmax is online (a running max and sum
   per row, the output accumulator rescaled when the max grows): the S x S scores are never
   stored, only one BQ x BK tile per thread.

   Instantiated per element types and tile constants: define KILN_FA_FN, KILN_FA_TQ, _TK,
   _TV, _TM (the mask's element type), _TO, KILN_FA_LD(x) (an element as float), KILN_FA_ST(x)
   (a float as the output element), KILN_FA_L (vector lanes of float), KILN_FA_MR (rows per
   micro-tile), KILN_FA_NK (vectors of keys per Q·Kᵀ micro-tile), KILN_FA_NO (vectors of the
   value dim per P·V micro-tile), KILN_FA_BK (keys per block, a multiple of NK * L),
   KILN_FA_BQ (rows per task, a multiple of MR), KILN_FA_D, KILN_FA_DV, KILN_FA_DVP (DV
   rounded up to a multiple of NO * L) before this file. A shared kernel (kiln.codegen.csource
   c_shared): sizes and strides are arguments, so the instance is a translation unit of its own,
   compiled as soon as it is lowered while the rest of the module lowers (it took 1.06 s of a
   cold bert_encoder compile's C compiler, after all of the Python stages when it was inlined
   into the module's units), and kept in the per-machine object cache.

   Tensors are read through element strides over their logical axes (b, h, s, d): any
   permutation of a contiguous tensor (the exporters' head Transposes) is read in place.
   K and V are first packed (converted to float): Kᵀ in panels [b][g][block][D][BK] (keys
   contiguous, for the micro-kernel's vector loads) and V as [b][g][SKP][DVP]; memory linear
   in the sequence. Where V's rows are contiguous float32 whole vectors (vd = 1, DV = DVP), P·V
   reads them in place and only Kᵀ is packed, 16 keys at a time by register transposes where K's
   rows are contiguous too (AVX-512; a pack of scalar copies was an eighth of the kernel's time
   at 12 heads x 128 keys). Grouped-query / multi-query attention: query head h reads K/V head
   h / (HQ / HKV), packed once, never copied per query head.

   Masks: mask_kind 0 none, 1 additive (float), 2 boolean (true: visible; false: the score
   becomes `fill`), 3 boolean the other way round (true: the score becomes `fill`), read through strides over (b, h, sq, sk) (0 where broadcast). causal >=
   0: key t is visible to query s iff t <= s + causal (blocks above the diagonal are
   skipped). A mask block whose every entry is <= -1e30 (or false with fill <= -1e30) is
   skipped once every row of the tile has a visible key (its exp underflows to exactly 0
   there); an all-zero (all-true) block skips the mask's reads.
   A row with no finite score (everything masked with -inf): NaN when empty_nan (what
   softmax of the decomposed graph gives), else zeros (ONNX Attention's rule).
   kv_lens (NULL: every key): keys valid per batch entry, read at run time (a static KV
   cache's rows written so far; clamped to [0, SK]); keys past them are never read or
   packed, and the causal offset counts from the end of the valid keys (causal + kv_lens[b]
   - SQ: the queries are the last SQ of them, as ONNX Attention's nonpad_kv_seqlen).
   Direct reads (KILN_FA_DIRECT, float32 with D and DV whole vectors): when K and V rows are
   contiguous (kd = vd = 1), there is no mask or one row of it for every head and query, and
   a task's rows fit one tile (decoding: the G
   query heads of a group, one token each), nothing is packed: Q·Kᵀ takes each key row's dot
   products in place and P·V reads V rows in place, so a decode step reads the cache once and
   copies none of it.
   Returns 0, or -1 when out of memory. */
/* the kernel's parameters (its declaration's and its definition's) */
#ifndef KILN_FA_PARAMS
#define KILN_FA_PARAMS \
    const KILN_FA_TQ* q, const KILN_FA_TK* k, const KILN_FA_TV* v, const KILN_FA_TM* mask, \
    const int64_t* kv_lens, KILN_FA_TO* out, \
    int64_t B, int64_t HQ, int64_t HKV, int64_t SQ, int64_t SK, \
    int64_t qb, int64_t qh, int64_t qs, int64_t qd, int64_t kb_, int64_t kh, int64_t ks, int64_t kd, \
    int64_t vb, int64_t vh, int64_t vs, int64_t vd, int64_t ob, int64_t oh, int64_t os, int64_t od, \
    int mask_kind, int64_t mb, int64_t mh, int64_t mq, int64_t mk, float fill, \
    float scale, int64_t causal, int empty_nan, int64_t parallel_min
#endif
__attribute__((visibility("hidden"))) int32_t KILN_FA_FN(KILN_FA_PARAMS);
/* kiln: definition */
#ifndef KILN_FA_COMMON
#define KILN_FA_COMMON
#define KILN_FA_DEAD (-1e30f)
/* exp (kiln_exp.h), 0 below -87.3 (where float's exp underflows anyway), NaN-free for -inf */
static inline float kiln_fa_exp(float x) {
  const float lo = -87.3f;
  return x < lo ? 0.0f : kiln_exp_clamped(x > 88.0f ? 88.0f : x);
}
static inline float kiln_fa_bf16(uint16_t x) {
  union { uint32_t i; float f; } u = { (uint32_t)x << 16 };
  return u.f;
}
static inline uint16_t kiln_fa_to_bf16(float f) {
  union { float f; uint32_t i; } u = { f };
  if ((u.i & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u.i >> 16) | 0x40u);  /* NaN stays NaN */
  return (uint16_t)((u.i + 0x7fffu + ((u.i >> 16) & 1u)) >> 16);
}
#if KILN_FA_L == 16
typedef float kiln_fa_v16 __attribute__((vector_size(64)));
/* x[r][c] -> x[c][r] for a 16 x 16 block of floats: 32-bit then 64-bit interleaves within
   128-bit lanes, then two rounds of 128-bit lane moves (64 shuffles for 256 elements) */
static inline void kiln_fa_transpose16(kiln_fa_v16* x) {
  kiln_fa_v16 t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = __builtin_shufflevector(x[i], x[i + 1], 0, 16, 1, 17, 4, 20, 5, 21, 8, 24, 9, 25, 12, 28, 13, 29);
    t[i + 1] = __builtin_shufflevector(x[i], x[i + 1], 2, 18, 3, 19, 6, 22, 7, 23, 10, 26, 11, 27, 14, 30, 15, 31);
  }
  /* u[4i + k], 128-bit lane q: column 4q + k of rows 4i .. 4i + 3 */
  for (int i = 0; i < 16; i += 4) {
    u[i] = __builtin_shufflevector(t[i], t[i + 2], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29);
    u[i + 1] = __builtin_shufflevector(t[i], t[i + 2], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
    u[i + 2] = __builtin_shufflevector(t[i + 1], t[i + 3], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29);
    u[i + 3] = __builtin_shufflevector(t[i + 1], t[i + 3], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
  }
  for (int k = 0; k < 4; ++k) {
    const kiln_fa_v16 p0 = __builtin_shufflevector(u[k], u[4 + k], 0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const kiln_fa_v16 p1 = __builtin_shufflevector(u[k], u[4 + k], 8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    const kiln_fa_v16 p2 = __builtin_shufflevector(u[8 + k], u[12 + k], 0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const kiln_fa_v16 p3 = __builtin_shufflevector(u[8 + k], u[12 + k], 8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    x[k] = __builtin_shufflevector(p0, p2, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
    x[4 + k] = __builtin_shufflevector(p0, p2, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    x[8 + k] = __builtin_shufflevector(p1, p3, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
    x[12 + k] = __builtin_shufflevector(p1, p3, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  }
}
#endif
#endif

#define KILN_FA_CAT2(a, b) a##b
#define KILN_FA_CAT(a, b) KILN_FA_CAT2(a, b)
#define KILN_FA_CTX KILN_FA_CAT(KILN_FA_FN, _ctx)
/* what the three parallel loops read (kiln_par_for's context): the arguments and the sizes */
struct KILN_FA_CTX {
  const KILN_FA_TQ* q; const KILN_FA_TK* k; const KILN_FA_TV* v; const KILN_FA_TM* mask;
  const int64_t* kv_lens; KILN_FA_TO* out;
  int64_t B, HQ, HKV, SQ, SK, qb, qh, qs, qd, kb_, kh, ks, kd, vb, vh, vs, vd, ob, oh, os, od;
  int mask_kind; int64_t mb, mh, mq, mk; float fill, scale; int64_t causal; int empty_nan;
  int64_t G, SKM, HG, RQ, NKB, NQT, SKP, MBN, MHN, MQN, NKBP; int direct, vdirect;
  float* kp; float* vp; unsigned char* states;
};
#define KILN_FA_UNPACK(c_) \
  typedef float fv __attribute__((vector_size(KILN_FA_L * 4))); \
  enum { L = KILN_FA_L, MR = KILN_FA_MR, NK = KILN_FA_NK, NO = KILN_FA_NO, BK = KILN_FA_BK, BQ = KILN_FA_BQ, \
         D = KILN_FA_D, DV = KILN_FA_DV, DVP = KILN_FA_DVP }; \
  const struct KILN_FA_CTX* c = (const struct KILN_FA_CTX*)(c_); \
  const KILN_FA_TQ* q = c->q; const KILN_FA_TK* k = c->k; const KILN_FA_TV* v = c->v; \
  const KILN_FA_TM* mask = c->mask; const int64_t* kv_lens = c->kv_lens; KILN_FA_TO* out = c->out; \
  const int64_t B = c->B, HQ = c->HQ, HKV = c->HKV, SQ = c->SQ, SK = c->SK; \
  const int64_t qb = c->qb, qh = c->qh, qs = c->qs, qd = c->qd, kb_ = c->kb_, kh = c->kh, ks = c->ks, kd = c->kd; \
  const int64_t vb = c->vb, vh = c->vh, vs = c->vs, vd = c->vd, ob = c->ob, oh = c->oh, os = c->os, od = c->od; \
  const int mask_kind = c->mask_kind; const int64_t mb = c->mb, mh = c->mh, mq = c->mq, mk = c->mk; \
  const float fill = c->fill, scale = c->scale; const int64_t causal = c->causal; const int empty_nan = c->empty_nan; \
  const int64_t G = c->G, SKM = c->SKM, HG = c->HG, RQ = c->RQ, NKB = c->NKB, NQT = c->NQT, SKP = c->SKP; \
  const int64_t MBN = c->MBN, MHN = c->MHN, MQN = c->MQN, NKBP = c->NKBP; const int direct = c->direct; \
  const int vdirect = c->vdirect; \
  float* kp = c->kp; float* vp = c->vp; unsigned char* states = c->states; \
  (void)q; (void)k; (void)v; (void)mask; (void)kv_lens; (void)out; (void)B; (void)HQ; (void)HKV; (void)SQ; \
  (void)SK; (void)qb; (void)qh; (void)qs; (void)qd; (void)kb_; (void)kh; (void)ks; (void)kd; (void)vb; (void)vh; \
  (void)vs; (void)vd; (void)ob; (void)oh; (void)os; (void)od; (void)mask_kind; (void)mb; (void)mh; (void)mq; \
  (void)mk; (void)fill; (void)scale; (void)causal; (void)empty_nan; (void)G; (void)SKM; (void)HG; (void)RQ; \
  (void)NKB; (void)NQT; (void)SKP; (void)MBN; (void)MHN; (void)MQN; (void)NKBP; (void)direct; (void)vdirect; \
  (void)kp; (void)vp; \
  (void)states
/* 1. K and V packed per (batch, K/V head, key block) */
static void KILN_FA_CAT(KILN_FA_FN, _pack)(void* c_, int64_t lo, int64_t hi) {
  KILN_FA_UNPACK(c_);
  for (int64_t i = lo; i < hi; ++i) {
    const int64_t b = i / (HKV * NKBP), g = i / NKBP % HKV, blk = i % NKBP;
    const int64_t SKb = kv_lens ? (kv_lens[b] < 0 ? 0 : kv_lens[b] > SK ? SK : kv_lens[b]) : SK;
    float* kdst = kp + ((size_t)(b * HKV + g) * NKB + blk) * D * BK;
    float* vdst = vdirect ? 0 : vp + ((size_t)(b * HKV + g) * SKP + blk * BK) * DVP;
    int64_t j = 0;
#if KILN_FA_DIRECT && KILN_FA_L == 16
    if (kd == 1 && vdirect)  /* Kᵀ by 16 x 16 transposes in registers, 16 keys at a time */
      for (; j + L <= BK && blk * BK + j + L <= SKb; j += L) {
        const float* kr = (const float*)k + b * kb_ + g * kh + (blk * BK + j) * ks;
        for (int64_t d = 0; d < D; d += L) {
          fv x[16];
          for (int r = 0; r < 16; ++r) memcpy(&x[r], kr + r * ks + d, sizeof(fv));
          kiln_fa_transpose16(x);
          for (int r = 0; r < 16; ++r) memcpy(kdst + (d + r) * BK + j, &x[r], sizeof(fv));
        }
      }
#endif
    for (; j < BK; ++j) {
      const int64_t t = blk * BK + j;
      if (t < SKb) {
        const KILN_FA_TK* kr = k + b * kb_ + g * kh + t * ks;
        for (int64_t d = 0; d < D; ++d) kdst[d * BK + j] = KILN_FA_LD(kr[d * kd]);
        if (vdirect) continue;
        const KILN_FA_TV* vr = v + b * vb + g * vh + t * vs;
        for (int64_t e = 0; e < DV; ++e) vdst[j * DVP + e] = KILN_FA_LD(vr[e * vd]);
        for (int64_t e = DV; e < DVP; ++e) vdst[j * DVP + e] = 0.0f;
      } else {
        for (int64_t d = 0; d < D; ++d) kdst[d * BK + j] = 0.0f;
        if (vdirect) continue;
        for (int64_t e = 0; e < DVP; ++e) vdst[j * DVP + e] = 0.0f;
      }
    }
  }
}
/* 2. the mask's block states per (mask batch, mask head; q tile, key block) */
static void KILN_FA_CAT(KILN_FA_FN, _states)(void* c_, int64_t lo, int64_t hi) {
  KILN_FA_UNPACK(c_);
  for (int64_t i = lo; i < hi; ++i) {
    const int64_t x = i / (MQN * NKB), y = i % (MQN * NKB);
    const int64_t b = x / MHN, h = x % MHN, qt = y / NKB, blk = y % NKB;
    const int64_t q0 = qt * BQ, k0 = blk * BK;
    const int64_t nr = mq ? (SQ - q0 < BQ ? SQ - q0 : BQ) : 1, nk = SKM - k0 < BK ? SKM - k0 : BK;
    int dead = 1, zero = 1;
    for (int64_t r = 0; r < nr && (dead || zero); ++r) {
      const KILN_FA_TM* row = mask + b * mb + h * mh + (q0 + r) * mq + k0 * mk;
      for (int64_t j = 0; j < nk; ++j) {
        if (mask_kind == 1) {
          const float m = (float)row[j * mk];
          dead &= m <= KILN_FA_DEAD;
          zero &= m == 0.0f;
        } else {
          const int on = (row[j * mk] != 0) != (mask_kind == 3);
          dead &= !on && fill <= KILN_FA_DEAD;
          zero &= on;
        }
      }
    }
    states[x * MQN * NKB + y] = (unsigned char)(dead ? 1 : zero ? 2 : 0);
  }
}
/* A tile's two products, C = C * alpha + A·B over its nrows rows: S = Q·Kᵀ (from zero: ALPHA
   a null pointer, C not read) and O = O * alpha + P·V (the online softmax's rescaling; rows past
   nrows scaled by 0). Micro-tiles of MR rows x NV vectors held in registers over k < K: A[r][k]
   broadcast, B's row k (LDB floats) loaded as NV vectors; C's rows NC floats wide. */
#define KILN_FA_PRODUCT(NV, A, B, LDB, K, C, NC, ALPHA) \
  for (int64_t r0 = 0; r0 < nrows; r0 += MR) \
    for (int64_t c0 = 0; c0 < (NC); c0 += (NV) * L) { \
      fv acc_[MR][NV]; \
      _Pragma("GCC unroll 16") \
      for (int r_ = 0; r_ < MR; ++r_) { \
        const float a_ = (ALPHA) && r0 + r_ < nrows ? (ALPHA)[r0 + r_] : 0.0f; \
        _Pragma("GCC unroll 8") \
        for (int n_ = 0; n_ < (NV); ++n_) { \
          if (ALPHA) { \
            memcpy(&acc_[r_][n_], &(C)[r0 + r_][c0 + n_ * L], sizeof(fv)); \
            acc_[r_][n_] *= a_; \
          } else { \
            acc_[r_][n_] = (fv){0}; \
          } \
        } \
      } \
      for (int64_t k_ = 0; k_ < (K); ++k_) { \
        fv b_[NV]; \
        _Pragma("GCC unroll 8") \
        for (int n_ = 0; n_ < (NV); ++n_) memcpy(&b_[n_], (B) + k_ * (LDB) + c0 + n_ * L, sizeof(fv)); \
        _Pragma("GCC unroll 16") \
        for (int r_ = 0; r_ < MR; ++r_) { \
          const float p_ = (A)[r0 + r_][k_]; \
          _Pragma("GCC unroll 8") \
          for (int n_ = 0; n_ < (NV); ++n_) acc_[r_][n_] += p_ * b_[n_]; \
        } \
      } \
      _Pragma("GCC unroll 16") \
      for (int r_ = 0; r_ < MR; ++r_) \
        _Pragma("GCC unroll 8") \
        for (int n_ = 0; n_ < (NV); ++n_) memcpy(&(C)[r0 + r_][c0 + n_ * L], &acc_[r_][n_], sizeof(fv)); \
    }
/* 3. the attention of each (batch, head group, q tile) */
static void KILN_FA_CAT(KILN_FA_FN, _tiles)(void* c_, int64_t lo, int64_t hi) {
  KILN_FA_UNPACK(c_);
  for (int64_t i = lo; i < hi; ++i) {
    const int64_t b = i / (HQ / HG * NQT), hg = i / NQT % (HQ / HG), qt = i % NQT;
    const int64_t h = hg * HG, g = h / G, q0 = qt * BQ, nrows = RQ - q0 < BQ ? RQ - q0 : BQ;
    const int64_t SKb = kv_lens ? (kv_lens[b] < 0 ? 0 : kv_lens[b] > SK ? SK : kv_lens[b]) : SK;
    const int64_t NKBb = (SKb + BK - 1) / BK;
    const int cmode = causal >= 0;
    const int64_t cz = cmode && kv_lens ? causal + SKb - SQ : causal;
    float qt_[BQ][D] __attribute__((aligned(64)));
    float o[BQ][DVP] __attribute__((aligned(64)));
    float s[BQ][BK] __attribute__((aligned(64)));
    /* each row's running sum kept as L lane sums (summed across lanes once, at the end: a
       horizontal sum per row and block is a chain of dependent adds as long as the block's exps) */
    float lv[BQ][L] __attribute__((aligned(64)));
    float m[BQ], alpha[BQ];
    int64_t rh[BQ], rs[BQ], smax = 0;  /* each row's query head and position */
    for (int64_t r = 0; r < BQ; ++r) {
      const int64_t rr = q0 + (r < nrows ? r : nrows - 1);
      rh[r] = h + rr / SQ;
      rs[r] = rr % SQ;
      smax = rs[r] > smax ? rs[r] : smax;
      const KILN_FA_TQ* qr = q + b * qb + rh[r] * qh + rs[r] * qs;
      for (int64_t d = 0; d < D; ++d) qt_[r][d] = scale * KILN_FA_LD(qr[d * qd]);
      for (int64_t e = 0; e < DVP; ++e) o[r][e] = 0.0f;
      for (int i = 0; i < L; ++i) lv[r][i] = 0.0f;
      m[r] = -INFINITY;
    }
    const unsigned char* st = mask_kind ? states + ((mb ? b : 0) * MHN + (mh ? h : 0)) * MQN * NKB
                                            + (mq ? qt : 0) * NKB : 0;
    const float* kpg = kp + (size_t)(b * HKV + g) * NKB * D * BK;
    const float* vpg = vp + (size_t)(b * HKV + g) * SKP * DVP;
    int live = 0;  /* every row of the tile has seen a score above the dead level */
    for (int64_t blk = 0; blk < NKBb; ++blk) {
      const int64_t k0 = blk * BK, nk = SKb - k0 < BK ? SKb - k0 : BK;
      if (cmode && k0 > smax + cz) break;
      const int state = mask_kind ? st[blk] : 2;
      if (state == 1 && live) continue;
      const float* kb = kpg + blk * D * BK;
#if KILN_FA_DIRECT
      if (direct) {  /* S = Q·Kᵀ from the key rows in place: per key, a dot product per row */
        const float* krow = (const float*)k + b * kb_ + g * kh + k0 * ks;
        for (int64_t j = 0; j < nk; ++j, krow += ks) {
          fv kk[D / L];
          #pragma GCC unroll 16
          for (int c = 0; c < D / L; ++c) memcpy(&kk[c], krow + c * L, sizeof(fv));
          for (int64_t r = 0; r < nrows; ++r) {
            fv acc = (fv){0};
            #pragma GCC unroll 16
            for (int c = 0; c < D / L; ++c) {
              fv qq;
              memcpy(&qq, &qt_[r][c * L], sizeof(fv));
              acc += qq * kk[c];
            }
            float t[L];  /* a tree of halves, not L dependent adds */
            memcpy(t, &acc, sizeof(fv));
            #pragma GCC unroll 8
            for (int w = L / 2; w >= 1; w /= 2)
              #pragma GCC unroll 16
              for (int i = 0; i < w; ++i) t[i] += t[i + w];
            s[r][j] = t[0];
          }
        }
      } else
#endif
      /* S = Q·Kᵀ, MR x (NK * L) micro-tiles held in registers over d */
      KILN_FA_PRODUCT(NK, qt_, kb, BK, D, s, BK, (const float*)0);
      /* mask, causal bound, keys past the end; then the online softmax per row */
      int all_live = 1;
      for (int64_t r = 0; r < nrows; ++r) {
        float* sr = s[r];
        const int64_t row = rs[r];
        if (state == 0) {
          const KILN_FA_TM* mr_ = mask + (mask_kind ? b * mb + h * mh + row * mq + k0 * mk : 0);
          if (mask_kind == 1) {
            for (int64_t j = 0; j < nk; ++j) sr[j] += (float)mr_[j * mk];
          } else if (mask_kind == 2) {
            for (int64_t j = 0; j < nk; ++j) sr[j] = mr_[j * mk] ? sr[j] : fill;
          } else {
            for (int64_t j = 0; j < nk; ++j) sr[j] = mr_[j * mk] ? fill : sr[j];
          }
        } else if (state == 1) {  /* dead, but some row has seen nothing live yet */
          if (mask_kind == 1) {
            const KILN_FA_TM* mr_ = mask + b * mb + h * mh + row * mq + k0 * mk;
            for (int64_t j = 0; j < nk; ++j) sr[j] += (float)mr_[j * mk];
          } else {
            for (int64_t j = 0; j < nk; ++j) sr[j] = fill;
          }
        }
        int64_t vis = nk;
        if (cmode && row + cz - k0 + 1 < vis) vis = row + cz - k0 + 1;
        if (vis < 0) vis = 0;
        for (int64_t j = vis; j < BK; ++j) sr[j] = -INFINITY;
        float mx = -INFINITY;
        #pragma omp simd reduction(max:mx)
        for (int64_t j = 0; j < BK; ++j) mx = sr[j] > mx ? sr[j] : mx;
        const float mnew = mx > m[r] ? mx : m[r];
        if (mnew == -INFINITY) {  /* nothing visible yet: no weight, nothing to rescale */
          for (int64_t j = 0; j < BK; ++j) sr[j] = 0.0f;
          alpha[r] = 1.0f;
          all_live = 0;
          continue;
        }
        const float a = alpha[r] = kiln_fa_exp(m[r] - mnew);
        #pragma omp simd
        for (int64_t j = 0; j < BK; ++j) sr[j] = kiln_fa_exp(sr[j] - mnew);
        #pragma omp simd
        for (int i = 0; i < L; ++i) {
          float t = lv[r][i] * a;
          for (int64_t c = 0; c < BK / L; ++c) t += sr[c * L + i];
          lv[r][i] = t;
        }
        m[r] = mnew;
        all_live &= mnew > 0.1f * KILN_FA_DEAD;
      }
      live = all_live;
      const float* vblk = vpg + k0 * DVP;
#if KILN_FA_DIRECT
      if (direct) {  /* O = O * alpha + P·V from the value rows in place */
        const float* vrow0 = (const float*)v + b * vb + g * vh + k0 * vs;
        for (int64_t r = 0; r < nrows; ++r) {
          fv acc[DV / L];
          #pragma GCC unroll 16
          for (int c = 0; c < DV / L; ++c) {
            memcpy(&acc[c], &o[r][c * L], sizeof(fv));
            acc[c] *= alpha[r];
          }
          const float* vrow = vrow0;
          for (int64_t j = 0; j < nk; ++j, vrow += vs) {
            const float p = s[r][j];
            #pragma GCC unroll 16
            for (int c = 0; c < DV / L; ++c) {
              fv vv;
              memcpy(&vv, vrow + c * L, sizeof(fv));
              acc[c] += p * vv;
            }
          }
          #pragma GCC unroll 16
          for (int c = 0; c < DV / L; ++c) memcpy(&o[r][c * L], &acc[c], sizeof(fv));
        }
      } else
#endif
#if KILN_FA_DIRECT
      if (vdirect) {  /* V's rows in place (contiguous, whole vectors): nothing of V packed */
        const float* vrows = (const float*)v + b * vb + g * vh + k0 * vs;
        KILN_FA_PRODUCT(NO, s, vrows, vs, nk, o, DVP, alpha);
      } else
#endif
      /* O = O * alpha + P·V, MR x (NO * L) micro-tiles held in registers over the keys */
      KILN_FA_PRODUCT(NO, s, vblk, DVP, nk, o, DVP, alpha);
    }
    for (int64_t r = 0; r < nrows; ++r) {
      float l = 0.0f;
      for (int i = 0; i < L; ++i) l += lv[r][i];
      const float inv = l > 0.0f ? 1.0f / l : empty_nan ? NAN : 0.0f;
      KILN_FA_TO* orow = out + b * ob + rh[r] * oh + rs[r] * os;
      for (int64_t e = 0; e < DV; ++e) orow[e * od] = KILN_FA_ST(o[r][e] * inv);
    }
  }
}


__attribute__((weak, visibility("hidden"), noinline)) int32_t KILN_FA_FN(KILN_FA_PARAMS) {
  typedef float fv __attribute__((vector_size(KILN_FA_L * 4)));
  enum { L = KILN_FA_L, MR = KILN_FA_MR, NK = KILN_FA_NK, NO = KILN_FA_NO, BK = KILN_FA_BK, BQ = KILN_FA_BQ,
         D = KILN_FA_D, DV = KILN_FA_DV, DVP = KILN_FA_DVP };
  const int64_t G = HQ / HKV;
  int64_t SKM = SK;  /* keys any batch entry reads */
  if (kv_lens) {
    SKM = 0;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t n = kv_lens[b] < 0 ? 0 : kv_lens[b] > SK ? SK : kv_lens[b];
      SKM = n > SKM ? n : SKM;
    }
  }
  /* query heads per task: a K/V group's G heads are one task's rows (decoding: G rows per
     micro-tile, not 1 of MR) unless a mask differs per head or query (each head then is its
     own task, its mask rows and block states); a mask broadcast over both (decoding's
     [B, 1, 1, keys] padding and causal mask) is one row for all of them */
  const int shared_mask = !mask_kind || (!mh && !mq);
  const int64_t HG = shared_mask ? G : 1, RQ = HG * SQ;
  const int64_t NKB = (SKM + BK - 1) / BK, NQT = (RQ + BQ - 1) / BQ;
  const int64_t SKP = NKB * BK;
  /* block states (mask): per (mask batch, mask head, q tile, key block): 0 mixed, 1 dead, 2 zero */
  const int64_t MBN = mask_kind && mb ? B : 1, MHN = mask_kind && mh ? HQ : 1, MQN = mask_kind && mq ? NQT : 1;
  const int direct = KILN_FA_DIRECT && kd == 1 && vd == 1 && shared_mask && RQ <= BQ;
  const size_t kbytes = direct ? 0 : sizeof(float) * (size_t)(B * HKV) * (size_t)SKP * D;
  /* V read in place by P·V where its rows are contiguous whole vectors (float32, vd = 1, DV
     a whole number of the micro-tile's vectors): only Kᵀ is packed */
  const int vdirect = direct || (KILN_FA_DIRECT && vd == 1 && DV == DVP);
  const size_t vbytes = vdirect ? 0 : sizeof(float) * (size_t)(B * HKV) * (size_t)SKP * DVP;
  const size_t sbytes = mask_kind ? (size_t)(MBN * MHN * MQN * NKB) : 0;
  float* kp = (float*)kiln_alloc(kbytes + vbytes + sbytes + 64);
  if (!kp) return -1;
  float* vp = kp + kbytes / sizeof(float);
  unsigned char* states = (unsigned char*)(vp + vbytes / sizeof(float));
  const int64_t NKBP = direct ? 0 : NKB;  /* blocks packed */
  const int par = B * HQ * SQ * SKM * (D + DV) >= parallel_min;
  struct KILN_FA_CTX c = { q, k, v, mask, kv_lens, out, B, HQ, HKV, SQ, SK, qb, qh, qs, qd, kb_, kh, ks, kd,
                           vb, vh, vs, vd, ob, oh, os, od, mask_kind, mb, mh, mq, mk, fill, scale, causal, empty_nan,
                           G, SKM, HG, RQ, NKB, NQT, SKP, MBN, MHN, MQN, NKBP, direct, vdirect, kp, vp, states };
  kiln_par_for(KILN_FA_CAT(KILN_FA_FN, _pack), &c, 0, B * HKV * NKBP, par);
  if (mask_kind) kiln_par_for(KILN_FA_CAT(KILN_FA_FN, _states), &c, 0, MBN * MHN * MQN * NKB, par);
  kiln_par_for(KILN_FA_CAT(KILN_FA_FN, _tiles), &c, 0, B * (HQ / HG) * NQT, par);
  free(kp);
  return 0;
}

#undef KILN_FA_UNPACK
#undef KILN_FA_PRODUCT
#undef KILN_FA_CTX
#undef KILN_FA_CAT
#undef KILN_FA_CAT2
