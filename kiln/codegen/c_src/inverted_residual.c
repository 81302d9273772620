/* Fused inverted residual on the blocked layout: the kernel behind kiln.lower.inverted_residual
   (the op and its reference: kiln.ops.inverted_residual). Instantiated per vector width and
   register tile: define before this file
     KILN_IR_FN   the function's name
     KILN_IR_L    the channel block = the vector lanes (8 with AVX2, 16 with AVX-512)
     KILN_IR_OV   channel blocks per 1x1 register tile (at most 4)
     KILN_IR_RW<ov> for ov = 1..4: output columns of a tile of ov channel blocks (at most 14):
                  RW<ov> * ov accumulators stay in vector registers over the input channels
     KILN_IR_REGS the vector registers (a depthwise tile keeps its inputs in them where they fit)

   y = act3(project(act2(depthwise(act1(expand(x)))))) [+ r], with
     x  [N][ICB][H][W][L]                  the block's input
     w1 [ECB][ICB*L][L], b1 [ECB][L]       the 1x1 expand conv (packed as ConvNCHWc's)
     w2 [ECB][KH][KW][L], b2 [ECB][L]      the KHxKW depthwise conv, strides sh x sw, pads pt, pl
     w3 [OCB][ECB*L][L], b3 [OCB][L]       the 1x1 project conv
     r  [N][OCB][OH][OW][L] or NULL        a residual added last
     y  [N][OCB][OH][OW][L]
   ICr, ECr: the input and expanded channels the 1x1 convs sum over (at most ICB * L, ECB * L):
   the channels past them have zero weights in w1 (inputs) and w3 (expanded channels); ECo, OCo:
   the expanded and output channels made, those past them zero weights and bias (their outputs
   are stored as 0, + r).
   act: 0 none, 1 relu, 2 clip(lo, hi), 3 hardswish, 4 swish (x * sigmoid(x)); act[i] with
   bounds lo[i], hi[i] for i = 0, 1, 2 (after expand, depthwise, project).

   Why: the expanded tensor (ECB * L channels, typically 6x the input's) never goes to memory.
   Work goes in tasks of (image, band of output rows). A task keeps a ring of KH expanded input
   rows (each [ECB][Wp][L], zero columns either side for the padding), computes each expanded
   row once as the band moves down (a band's first rows also compute the KH - sh rows it shares
   with the band above), runs the depthwise conv of one output row into a row buffer
   [ECB][OW][L] and projects that row straight into y. The ring and the row stay in L1/L2.
   Tasks run in parallel (`par`: kiln_par_for, on the module's threads), each range of them with a
   ring of its own; `bands` per image. Returns 0, or -1 when out of memory.

   KILN_IR_FN_ed (kiln::ExpandDepthwise): the expand and depthwise convs alone, for a block whose
   project conv cannot follow row by row (a squeeze-excite gate between them needs the whole
   plane first): each depthwise row goes to y [N][ECB][OH][OW][L], and `m` (or NULL) gets the
   plane's mean per image and channel [N][ECB][L] (the gate's global average pool), summed as
   the rows are stored (per task, then over the bands).

   A shared kernel (kiln.codegen.csource.c_shared): the sizes are arguments, one instance
   serves every block of every model with the same vector width. */
__attribute__((visibility("hidden"))) int32_t KILN_IR_FN(
    const float* restrict x, const float* restrict w1, const float* restrict b1,
    const float* restrict w2, const float* restrict b2, const float* restrict w3,
    const float* restrict b3, const float* restrict r, float* restrict y,
    int64_t N, int64_t ICB, int64_t H, int64_t W, int64_t ECB, int64_t OCB, int64_t OH, int64_t OW,
    int64_t KH, int64_t KW, int64_t sh, int64_t sw, int64_t pt, int64_t pl,
    int64_t ICr, int64_t ECr, int64_t ECo, int64_t OCo,
    const int32_t* act, const float* lo, const float* hi, int64_t bands, int par);
#define KILN_IR_ED_FN KILN_IR_ED_CAT(KILN_IR_FN, _ed)
#define KILN_IR_ED_CAT(a, b) KILN_IR_ED_CAT2(a, b)
#define KILN_IR_ED_CAT2(a, b) a##b
__attribute__((visibility("hidden"))) int32_t KILN_IR_ED_FN(
    const float* restrict x, const float* restrict w1, const float* restrict b1,
    const float* restrict w2, const float* restrict b2, float* restrict y, float* restrict m,
    int64_t N, int64_t ICB, int64_t H, int64_t W, int64_t ECB, int64_t OH, int64_t OW,
    int64_t KH, int64_t KW, int64_t sh, int64_t sw, int64_t pt, int64_t pl, int64_t ICr, int64_t ECo,
    const int32_t* act, const float* lo, const float* hi, int64_t bands, int par);
/* kiln: definition */
/* Compiled as three units in parallel (kiln.codegen.csource.c_shared's parts: KILN_SHARED_PART),
   each with the helpers above its part, all of it in one unit where it is not split: part 2
   holds the 1x1 tiles of 3 and 2 channel blocks (KILN_IR_G3, G2), part 1 the depthwise row
   (KILN_IR_DW: its four window shapes' tiles) and the 1x1 tiles of one block (G1), part 0 the
   rest (the tasks, the 1x1 row, the tiles of 4 blocks). CPU seconds at -O3 (GCC 12, Sapphire
   Rapids, 16 lanes): G3 + G2 1.07, depthwise row 0.63 + G1 0.38, the rest 0.60 + G4 0.36; as
   two units (G3 + G2 apart) the other one took 2.06 s, the critical path of a cold compile. */
#define KILN_IR_CAT2(a, b) a##b
#define KILN_IR_CAT(a, b) KILN_IR_CAT2(a, b)
/* v held in a vector register from here on: GCC otherwise folds a depthwise tile's input
   loads into its FMAs as memory operands, loading each input vector once per tap that reads it
   (KC times) from the ring row, in L2 for the most part: the tile was bound by its loads */
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define KILN_IR_IN_REGISTER(v) __asm__("" : "+v"(v))
#elif defined(__GNUC__) && defined(__aarch64__)
#define KILN_IR_IN_REGISTER(v) __asm__("" : "+w"(v))
#else
#define KILN_IR_IN_REGISTER(v) ((void)0)
#endif
#define IR_LD(p) ({ kiln_ir_v v_; __builtin_memcpy(&v_, (p), sizeof v_); v_; })
#define IR_ST(p, v) do { kiln_ir_v v_ = (v); __builtin_memcpy((p), &v_, sizeof v_); } while (0)
#ifndef KILN_IR_COMMON
#define KILN_IR_COMMON
typedef float kiln_ir_v __attribute__((vector_size(KILN_IR_L * 4)));
typedef int32_t kiln_ir_vi __attribute__((vector_size(KILN_IR_L * 4)));

static inline __attribute__((always_inline)) kiln_ir_v kiln_ir_sel(kiln_ir_vi m, kiln_ir_v a, kiln_ir_v b) {
  return (kiln_ir_v)(((kiln_ir_vi)a & m) | ((kiln_ir_vi)b & ~m));
}

/* a > b ? a : b and a < b ? a : b lane by lane, b where either is a NaN: x86's maxps and minps
   exactly, one instruction each, where GCC makes the select above a compare and two xors per
   select (a clamp to [lo, hi] took 6 instructions a vector, on the FMAs' ports: a quarter
   beside the 24 FMAs a vector of a 24 -> 144 expand tile) */
#if defined(__AVX512F__) && KILN_IR_L == 16
#include <immintrin.h>
#define KILN_IR_MAX(a, b) ((kiln_ir_v)_mm512_max_ps((__m512)(a), (__m512)(b)))
#define KILN_IR_MIN(a, b) ((kiln_ir_v)_mm512_min_ps((__m512)(a), (__m512)(b)))
#elif defined(__AVX__) && KILN_IR_L == 8
#include <immintrin.h>
#define KILN_IR_MAX(a, b) ((kiln_ir_v)_mm256_max_ps((__m256)(a), (__m256)(b)))
#define KILN_IR_MIN(a, b) ((kiln_ir_v)_mm256_min_ps((__m256)(a), (__m256)(b)))
#elif defined(__SSE__) && KILN_IR_L == 4
#include <immintrin.h>
#define KILN_IR_MAX(a, b) ((kiln_ir_v)_mm_max_ps((__m128)(a), (__m128)(b)))
#define KILN_IR_MIN(a, b) ((kiln_ir_v)_mm_min_ps((__m128)(a), (__m128)(b)))
#else
#define KILN_IR_MAX(a, b) ({ kiln_ir_v a_ = (a), b_ = (b); kiln_ir_sel(a_ > b_, a_, b_); })
#define KILN_IR_MIN(a, b) ({ kiln_ir_v a_ = (a), b_ = (b); kiln_ir_sel(a_ < b_, a_, b_); })
#endif

/* x * sigmoid(x) on a vector: kiln_sigmoid.h's float32 sigmoid (included before this file),
   lane by lane in a simd loop that GCC keeps in registers. Its inline exp and bit-mask selects
   take ~3.8 ns a 16-lane vector on Zen 4, where the form x / (1 + exp(-x)) with a clamped
   Cephes exp took ~6. */
static inline __attribute__((always_inline)) kiln_ir_v kiln_ir_swish(kiln_ir_v v) {
  float t[KILN_IR_L] __attribute__((aligned(64)));
  __builtin_memcpy(t, &v, sizeof v);
  #pragma omp simd
  for (int i = 0; i < KILN_IR_L; ++i) t[i] = t[i] * kiln_sigmoid_f32(t[i]);
  __builtin_memcpy(&v, t, sizeof v);
  return v;
}

/* The 1x1 tiles' activation is a clamp to [lo, hi] (none: +-inf, relu, clip), one form, so GCC
   makes each register tile once and not once per activation (a five-way switch inside the
   unrolled tiles, and a tile per remainder width, made 1.3 MB of code and 53 s of -O3 for the
   unit). Hardswish and swish tiles store the identity; kiln_ir_post runs over the row after
   (it is in L1/L2). A NaN stays NaN (KILN_IR_MAX and MIN return their second operand), as the
   reference's maximum. */
typedef struct { kiln_ir_v lo, hi; int post; } kiln_ir_actp;

static kiln_ir_actp kiln_ir_params(int a, float lo, float hi) {
  const float inf = __builtin_inff();
  kiln_ir_actp p = {(kiln_ir_v){0} - inf, (kiln_ir_v){0} + inf, a == 3 || a == 4 ? a : 0};
  if (a == 1) p.lo = (kiln_ir_v){0};
  if (a == 2) { p.lo = (kiln_ir_v){0} + lo; p.hi = (kiln_ir_v){0} + hi; }
  return p;
}

static inline __attribute__((always_inline)) kiln_ir_v kiln_ir_act(kiln_ir_v v, const kiln_ir_actp* p) {
  return KILN_IR_MIN(p->hi, KILN_IR_MAX(p->lo, v));    /* v < lo ? lo : v, then t > hi ? hi : t */
}

/* The activation by its code: the depthwise tiles (two instances) use this, which GCC
   specialises per case, cheaper per output than the branchless form (9 FMAs a vector) */
static inline __attribute__((always_inline)) kiln_ir_v kiln_ir_act_case(kiln_ir_v v, int a, float lo, float hi) {
  switch (a) {
    case 1: return KILN_IR_MAX((kiln_ir_v){0}, v);                      /* a NaN stays NaN, as the 1x1 tiles' */
    case 2: return KILN_IR_MIN((kiln_ir_v){0} + hi, KILN_IR_MAX((kiln_ir_v){0} + lo, v));
    case 3: { kiln_ir_v g = v * (1.0f / 6.0f) + 0.5f;
              g = KILN_IR_MIN((kiln_ir_v){0} + 1.0f, KILN_IR_MAX((kiln_ir_v){0}, g));
              return v * g; }
    case 4: return kiln_ir_swish(v);                                   /* x * sigmoid(x) */
    default: return v;
  }
}

/* activation `a` (kiln_ir_act_case's codes: hardswish, swish) over n vectors in each of
   `blocks` runs `bstride` floats apart, then + res (same layout, rstride) where given. One loop
   per case and per residual, each with its activation inlined: a switch per vector measured
   15% of a 24->144->24 56x56 HardSwish block. */
#define KILN_IR_POST_LOOP(A, RES) \
  for (int64_t b = 0; b < blocks; ++b) { \
    float* vb = v + b * bstride; \
    const float* rb = (RES) ? res + b * rstride : NULL; \
    for (int64_t i = 0; i < n; ++i) { \
      kiln_ir_v x = kiln_ir_act_case(IR_LD(vb + i * L), (A), 0.0f, 0.0f); \
      if (RES) x += IR_LD(rb + i * L); \
      IR_ST(vb + i * L, x); \
    } \
  }
static void kiln_ir_post(float* restrict v, int64_t blocks, int64_t bstride, int64_t n,
                         const float* restrict res, int64_t rstride, int a) {
  enum { L = KILN_IR_L };
  if (a == 3 && !res) KILN_IR_POST_LOOP(3, 0)
  else if (a == 3) KILN_IR_POST_LOOP(3, 1)
  else if (!res) KILN_IR_POST_LOOP(4, 0)
  else KILN_IR_POST_LOOP(4, 1)
}
#undef KILN_IR_POST_LOOP

/* One register tile of a 1x1 conv: RW columns x OV output channel blocks, over the first `icr`
   of the ICB * L input channels (the rest have zero weights: a narrow tensor's padding lanes,
   8 of 32 for 24 channels, skipped). in: the first column's block 0, channel blocks `ics`
   apart; w: the tile's first output block's weights [ICB*L][L], blocks IC*L apart; out/res:
   the first column's first block, blocks `ocs` / `rcs` apart. */
#define KILN_IR_PW_STEP(ib, wb, ii) do { \
      kiln_ir_v wv[4]; \
      _Pragma("GCC unroll 4") \
      for (int o = 0; o < OV; ++o) wv[o] = IR_LD((wb) + o * IC * L + (ii) * L); \
      _Pragma("GCC unroll 16") \
      for (int c = 0; c < RW; ++c) { \
        const float s = (ib)[c * L + (ii)]; \
        _Pragma("GCC unroll 4") \
        for (int o = 0; o < OV; ++o) acc[c][o] += s * wv[o]; \
      } \
    } while (0)
static inline __attribute__((always_inline)) void kiln_ir_pw_tile(
    const int RW, const int OV, const float* restrict in, int64_t ics, int64_t ICB, int64_t icr,
    const float* restrict w, const float* restrict bias, float* restrict out, int64_t ocs,
    const float* restrict res, int64_t rcs, const kiln_ir_actp* p) {
  enum { L = KILN_IR_L };
  const int64_t IC = ICB * L, full = icr / L, tail = icr % L;
  kiln_ir_v acc[14][4];
  #pragma GCC unroll 14
  for (int c = 0; c < RW; ++c)
    #pragma GCC unroll 4
    for (int o = 0; o < OV; ++o) acc[c][o] = IR_LD(bias + o * L);
  for (int64_t icb = 0; icb < full; ++icb) {
    const float* ib = in + icb * ics;
    const float* wb = w + icb * L * L;
    #pragma GCC unroll 4
    for (int ii = 0; ii < L; ++ii) KILN_IR_PW_STEP(ib, wb, ii);
  }
  if (tail) {
    const float* ib = in + full * ics;
    const float* wb = w + full * L * L;
    #pragma GCC unroll 4
    for (int ii = 0; ii < tail; ++ii) KILN_IR_PW_STEP(ib, wb, ii);
  }
  #pragma GCC unroll 4
  for (int o = 0; o < OV; ++o)
    #pragma GCC unroll 16
    for (int c = 0; c < RW; ++c) {
      kiln_ir_v v = kiln_ir_act(acc[c][o], p);
      if (res) v += IR_LD(res + o * rcs + c * L);
      IR_ST(out + o * ocs + c * L, v);
    }
}
#undef KILN_IR_PW_STEP

#if KILN_IR_L >= 8
/* A last output block whose used lanes fit half a vector (24 channels: 16 + 8) runs on half
   vectors (AVX-512: ymm, two FMAs a cycle where a zmm takes one), its other lanes stored as
   zero (their weights and bias are zero, and every activation here maps 0 to 0). */
#define KILN_IR_HALF 1
typedef float kiln_ir_vh __attribute__((vector_size(KILN_IR_L * 2)));
#define IR_LDH(p) ({ kiln_ir_vh v_; __builtin_memcpy(&v_, (p), sizeof v_); v_; })
static inline __attribute__((always_inline)) kiln_ir_v kiln_ir_widen(kiln_ir_vh h) {
  const kiln_ir_vh z = {0};
#if KILN_IR_L == 16
  return __builtin_shufflevector(h, z, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
#else
  return __builtin_shufflevector(h, z, 0, 1, 2, 3, 4, 5, 6, 7);
#endif
}

/* kiln_ir_pw_tile of one output block (OV = 1) on half vectors; F = 1: with the whole block
   before it (weights IC * L floats, outputs ocs / rcs floats before) in the same tile, so each
   broadcast input feeds both blocks' FMAs (a 24-channel output, 16 + 8: one pass over the input
   row where a whole-vector tile and a half one took two, each about as many loads as FMAs) */
static inline __attribute__((always_inline)) void kiln_ir_pw_tile_h(
    const int RW, const int F, const float* restrict in, int64_t ics, int64_t icr, int64_t IC,
    const float* restrict w, const float* restrict bias, float* restrict out, int64_t ocs,
    const float* restrict res, int64_t rcs, const kiln_ir_actp* p) {
  enum { L = KILN_IR_L };
  const int64_t full = icr / L, tail = icr % L;
  kiln_ir_vh acc[14];
  kiln_ir_v accf[14];
  const kiln_ir_vh b = IR_LDH(bias);
  #pragma GCC unroll 14
  for (int c = 0; c < RW; ++c) acc[c] = b;
  if (F) {
    const kiln_ir_v bf = IR_LD(bias - L);
    #pragma GCC unroll 14
    for (int c = 0; c < RW; ++c) accf[c] = bf;
  }
  for (int64_t icb = 0; icb <= full; ++icb) {
    const float* ib = in + icb * ics;
    const float* wb = w + icb * L * L;
    const int64_t n = icb < full ? L : tail;
    #pragma GCC unroll 4
    for (int64_t ii = 0; ii < n; ++ii) {
      const kiln_ir_vh wv = IR_LDH(wb + ii * L);
      if (F) {
        const kiln_ir_v wf = IR_LD(wb - IC * L + ii * L);
        #pragma GCC unroll 16
        for (int c = 0; c < RW; ++c) {
          const float s = ib[c * L + ii];
          acc[c] += s * wv;
          accf[c] += s * wf;
        }
        continue;
      }
      #pragma GCC unroll 16
      for (int c = 0; c < RW; ++c) acc[c] += ib[c * L + ii] * wv;
    }
  }
  if (F) {
    #pragma GCC unroll 16
    for (int c = 0; c < RW; ++c) {
      kiln_ir_v v = kiln_ir_act(accf[c], p);
      if (res) v += IR_LD(res - rcs + c * L);
      IR_ST(out - ocs + c * L, v);
    }
  }
  #pragma GCC unroll 16
  for (int c = 0; c < RW; ++c) {
    kiln_ir_v v = kiln_ir_act(kiln_ir_widen(acc[c]), p);
    if (res) v += IR_LD(res + c * L);
    IR_ST(out + c * L, v);
  }
}
#endif

#endif

#define KILN_IR_PIECE(n, OVc) if (ncols - c0 >= (n)) { \
      kiln_ir_pw_tile(n, OVc, in + c0 * L, ics, ICB, icr, wo, bo, out + ob * ocs + c0 * L, ocs, \
                      res ? res + ob * rcs + c0 * L : NULL, rcs, p); \
      c0 += (n); }
/* KILN_IR_G<OVc>: the tiles of OVc channel blocks (from block ob) over a row: RWc columns
   each, then the columns left over in pieces of 8, 4, 2 and 1 (each fewer than RWc, so their
   accumulators fit too): four tile instances per group instead of one per remainder keep the
   unit small. Weak and hidden, as the kernel: a function of its own so the groups can be
   compiled in two units. */
#define KILN_IR_GROUP(OVc, RWc) \
  __attribute__((weak, visibility("hidden"))) void KILN_IR_CAT(KILN_IR_FN, _g##OVc)( \
      const float* restrict in, int64_t ics, int64_t ICB, int64_t icr, int64_t ncols, const float* restrict w, \
      const float* restrict bias, int64_t ob, float* restrict out, int64_t ocs, const float* restrict res, \
      int64_t rcs, const kiln_ir_actp* p) { \
    enum { L = KILN_IR_L }; \
    const int64_t IC = ICB * L; \
    const float* wo = w + ob * IC * L; \
    const float* bo = bias + ob * L; \
    int64_t c0 = 0; \
    for (; c0 + (RWc) <= ncols; c0 += (RWc)) \
      kiln_ir_pw_tile(RWc, OVc, in + c0 * L, ics, ICB, icr, wo, bo, out + ob * ocs + c0 * L, ocs, \
                      res ? res + ob * rcs + c0 * L : NULL, rcs, p); \
    if ((RWc) > 8) KILN_IR_PIECE(8, OVc) \
    if ((RWc) > 4) KILN_IR_PIECE(4, OVc) \
    if ((RWc) > 2) KILN_IR_PIECE(2, OVc) \
    while (c0 < ncols) KILN_IR_PIECE(1, OVc) \
  }
#define KILN_IR_G1 KILN_IR_CAT(KILN_IR_FN, _g1)
#define KILN_IR_G2 KILN_IR_CAT(KILN_IR_FN, _g2)
#define KILN_IR_G3 KILN_IR_CAT(KILN_IR_FN, _g3)
#define KILN_IR_G4 KILN_IR_CAT(KILN_IR_FN, _g4)
#define KILN_IR_GROUP_ARGS const float* restrict, int64_t, int64_t, int64_t, int64_t, const float* restrict, \
  const float* restrict, int64_t, float* restrict, int64_t, const float* restrict, int64_t, const kiln_ir_actp*
__attribute__((visibility("hidden"))) void KILN_IR_G1(KILN_IR_GROUP_ARGS);
__attribute__((visibility("hidden"))) void KILN_IR_G2(KILN_IR_GROUP_ARGS);
__attribute__((visibility("hidden"))) void KILN_IR_G3(KILN_IR_GROUP_ARGS);
__attribute__((visibility("hidden"))) void KILN_IR_G4(KILN_IR_GROUP_ARGS);
#define KILN_IR_DW KILN_IR_CAT(KILN_IR_FN, _dw)
__attribute__((visibility("hidden"))) void KILN_IR_DW(const float* const*, int64_t, int64_t, int64_t, int64_t,
  int64_t, int64_t, const float* restrict, const float* restrict, float* restrict, int, float, float);
#if !defined(KILN_SHARED_PART) || KILN_SHARED_PART == 2
KILN_IR_GROUP(3, KILN_IR_RW3)
KILN_IR_GROUP(2, KILN_IR_RW2)
#endif
#if !defined(KILN_SHARED_PART) || KILN_SHARED_PART == 1
KILN_IR_GROUP(1, KILN_IR_RW1)

/* Swish over a depthwise tile's n outputs at dst (just stored, in L1), out of line: inlined
   into every tile (each window shape's three tile widths, unrolled) the sigmoid's code took
   0.33 s of the unit's 1.1-1.3 s of -O3 (GCC 12), the largest unit of the shared kernel. */
static __attribute__((noinline)) void kiln_ir_dw_swish(float* restrict dst, int n) {
  enum { L = KILN_IR_L };
  for (int c = 0; c < n; ++c) IR_ST(dst + c * L, kiln_ir_swish(IR_LD(dst + c * L)));
}

/* One output row of the depthwise conv, every channel block: rows[kh] are the ring's rows
   (column 0 = input column -pl), dst [ECB][OW][L]. DT output columns per tile. KC, SC
   (constants): the window is KC wide (3 or 5) at stride SC (1 or 2), and each input vector of a
   row is loaded once for every tap that reads it ((DT - 1) * SC + KC loads for KC * DT FMAs);
   KC = 0: KW and sw from the arguments, one load per FMA (bound by loads). */
static inline __attribute__((always_inline)) void kiln_ir_dw_tile(
    const int DT, const int KC, const int SC, const float* const* rows, int64_t off, int64_t KH, int64_t KW,
    int64_t sw, const float* restrict wk, kiln_ir_v bv, float* restrict dst, int a, float lo, float hi) {
  enum { L = KILN_IR_L };
  kiln_ir_v acc[8];
  #pragma GCC unroll 8
  for (int c = 0; c < DT; ++c) acc[c] = bv;
  for (int64_t kh = 0; kh < KH; ++kh) {
    const float* rp = rows[kh] + off;
    if (KC) {
      kiln_ir_v xin[19];
      #pragma GCC unroll 19
      for (int j = 0; j < (DT - 1) * SC + KC; ++j) {
        xin[j] = IR_LD(rp + j * L);
        if ((DT - 1) * SC + KC + DT + 1 <= KILN_IR_REGS) KILN_IR_IN_REGISTER(xin[j]);
      }
      #pragma GCC unroll 5
      for (int kw = 0; kw < KC; ++kw) {
        const kiln_ir_v wv = IR_LD(wk + (kh * KC + kw) * L);
        #pragma GCC unroll 8
        for (int c = 0; c < DT; ++c) acc[c] += xin[c * SC + kw] * wv;
      }
      continue;
    }
    for (int64_t kw = 0; kw < KW; ++kw) {
      const kiln_ir_v wv = IR_LD(wk + (kh * KW + kw) * L);
      #pragma GCC unroll 8
      for (int c = 0; c < DT; ++c) acc[c] += IR_LD(rp + (c * sw + kw) * L) * wv;
    }
  }
  if (a == 4) {   /* swish: out of line (kiln_ir_dw_swish) */
    #pragma GCC unroll 8
    for (int c = 0; c < DT; ++c) IR_ST(dst + c * L, acc[c]);
    kiln_ir_dw_swish(dst, DT);
    return;
  }
  #pragma GCC unroll 8
  for (int c = 0; c < DT; ++c) IR_ST(dst + c * L, kiln_ir_act_case(acc[c], a, lo, hi));
}

/* The tiles of a row of one channel block with a window KC x SC: DT columns, then DT / 2 (a
   7- or 14-wide row is most of a tile's remainder), and a last tile moved left to end at the
   row's end (it computes some columns again, the same values) rather than column by column. */
#define KILN_IR_DW_TILES(DTc, KCc, SCc) do { \
    for (; c0 + (DTc) <= OW; c0 += (DTc)) \
      kiln_ir_dw_tile(DTc, KCc, SCc, rows, c0 * (SCc) * L, KH, KCc, SCc, wk, bv, de + c0 * L, a, lo, hi); \
    if (c0 + (DTc) / 2 <= OW) { \
      kiln_ir_dw_tile((DTc) / 2, KCc, SCc, rows, c0 * (SCc) * L, KH, KCc, SCc, wk, bv, de + c0 * L, a, lo, hi); \
      c0 += (DTc) / 2; \
    } \
    if (c0 < OW && OW >= (DTc) / 2) { \
      c0 = OW - (DTc) / 2; \
      kiln_ir_dw_tile((DTc) / 2, KCc, SCc, rows, c0 * (SCc) * L, KH, KCc, SCc, wk, bv, de + c0 * L, a, lo, hi); \
      c0 = OW; \
    } \
  } while (0)

__attribute__((weak, visibility("hidden"))) void KILN_IR_DW(
    const float* const* ring_rows, int64_t rowstride, int64_t ECB, int64_t OW, int64_t KH, int64_t KW, int64_t sw,
    const float* restrict w2, const float* restrict b2, float* restrict dst, int a, float lo, float hi) {
  enum { L = KILN_IR_L, DT = 8 };
  const int kc = (KW == 3 || KW == 5) && (sw == 1 || sw == 2) ? (int)(KW * 2 + sw) : 0;
  for (int64_t e = 0; e < ECB; ++e) {
    const float* rows[16];
    for (int64_t kh = 0; kh < KH; ++kh) rows[kh] = ring_rows[kh] + e * rowstride;
    const float* wk = w2 + e * KH * KW * L;
    const kiln_ir_v bv = IR_LD(b2 + e * L);
    float* de = dst + e * OW * L;
    int64_t c0 = 0;
    switch (kc) {
      case 7: KILN_IR_DW_TILES(8, 3, 1); break;
      case 8: KILN_IR_DW_TILES(8, 3, 2); break;
      case 11: KILN_IR_DW_TILES(8, 5, 1); break;
      case 12: KILN_IR_DW_TILES(6, 5, 2); break;       /* (15 inputs, 6 sums and a weight in registers) */
      default:
        for (; c0 + DT <= OW; c0 += DT)
          kiln_ir_dw_tile(DT, 0, 1, rows, c0 * sw * L, KH, KW, sw, wk, bv, de + c0 * L, a, lo, hi);
    }
    for (; c0 < OW; ++c0)
      kiln_ir_dw_tile(1, 0, 1, rows, c0 * sw * L, KH, KW, sw, wk, bv, de + c0 * L, a, lo, hi);
  }
}
#undef KILN_IR_DW_TILES
#endif
#if !defined(KILN_SHARED_PART) || KILN_SHARED_PART == 0
KILN_IR_GROUP(4, KILN_IR_RW4)
#ifdef KILN_IR_HALF
#define KILN_IR_GH KILN_IR_CAT(KILN_IR_FN, _gh)
/* block ob's tiles on half vectors (kiln_ir_pw_tile_h), KILN_IR_RW1 columns, then 8, 4, 2, 1;
   `with_full`: block ob - 1's tiles with them (F = 1), KILN_IR_RW2 columns (its accumulators
   and the half block's fill the registers as a tile of two blocks' do) */
static void KILN_IR_GH(const float* restrict in, int64_t ics, int64_t ICB, int64_t icr, int64_t ncols,
                       const float* restrict w, const float* restrict bias, int64_t ob, float* restrict out,
                       int64_t ocs, const float* restrict res, int64_t rcs, const kiln_ir_actp* p, int with_full) {
  enum { L = KILN_IR_L };
  const int64_t IC = ICB * L;
  const float* wo = w + ob * IC * L;
  const float* bo = bias + ob * L;
  float* oo = out + ob * ocs;
  const float* ro = res ? res + ob * rcs : NULL;
  int64_t c0 = 0;
#define KILN_IR_HPIECE(n, F) kiln_ir_pw_tile_h(n, F, in + c0 * L, ics, icr, IC, wo, bo, oo + c0 * L, ocs, \
                                             ro ? ro + c0 * L : NULL, rcs, p)
#define KILN_IR_HROW(RW, F) do { \
    for (; c0 + (RW) <= ncols; c0 += (RW)) KILN_IR_HPIECE(RW, F); \
    if ((RW) > 8 && ncols - c0 >= 8) { KILN_IR_HPIECE(8, F); c0 += 8; } \
    if ((RW) > 4 && ncols - c0 >= 4) { KILN_IR_HPIECE(4, F); c0 += 4; } \
    if ((RW) > 2 && ncols - c0 >= 2) { KILN_IR_HPIECE(2, F); c0 += 2; } \
    for (; c0 < ncols; ++c0) KILN_IR_HPIECE(1, F); \
  } while (0)
  if (with_full) KILN_IR_HROW(KILN_IR_RW2, 1);
  else KILN_IR_HROW(KILN_IR_RW1, 0);
#undef KILN_IR_HROW
#undef KILN_IR_HPIECE
}
#endif

/* A 1x1 conv over `ncols` columns of one row: out[ocb][col] = act(sum w * in + b) (+ res).
   Output blocks go KILN_IR_OV at a time, the rest in one smaller group; each group size
   has its own columns per tile (KILN_IR_RW<ov>: its accumulators fill the registers). */
/* A 1x1 conv over `ncols` columns of one row: out[ocb][col] = act(sum w * in + b) (+ res), the
   sum over the first icr input channels; channels from ocr on have zero weights and bias. */
static void kiln_ir_pw_row(const float* restrict in, int64_t ics, int64_t ICB, int64_t icr, int64_t ncols,
                           const float* restrict w, const float* restrict bias, int64_t OCB,
                           float* restrict out, int64_t ocs, const float* restrict res, int64_t rcs,
                           int64_t ocr, int a, float lo, float hi) {
  enum { OV = KILN_IR_OV, L = KILN_IR_L };
  const kiln_ir_actp params = kiln_ir_params(a, lo, hi);
  const kiln_ir_actp* p = &params;
  const float* const res_after = p->post ? res : NULL;   /* added after kiln_ir_post */
  if (p->post) res = NULL;
  int64_t OCF = OCB;                   /* the blocks on whole vectors */
#ifdef KILN_IR_HALF
  if (ocr <= (OCB - 1) * L + L / 2) {
    OCF = OCB - 1;
    /* a whole block left alone after the groups of OV joins the half block's tiles */
        const int with_full = OCF % OV == 1 && OV > 1;
    KILN_IR_GH(in, ics, ICB, icr, ncols, w, bias, OCF, out, ocs, res, rcs, p, with_full);
    OCF -= with_full;
  }
#else
  (void)ocr;
#endif
  for (int64_t ob = 0; ob < OCF;) {
    const int64_t ov = OCF - ob < OV ? OCF - ob : OV;
    switch (ov) {
      case 4: KILN_IR_G4(in, ics, ICB, icr, ncols, w, bias, ob, out, ocs, res, rcs, p); break;
      case 3: KILN_IR_G3(in, ics, ICB, icr, ncols, w, bias, ob, out, ocs, res, rcs, p); break;
      case 2: KILN_IR_G2(in, ics, ICB, icr, ncols, w, bias, ob, out, ocs, res, rcs, p); break;
      default: KILN_IR_G1(in, ics, ICB, icr, ncols, w, bias, ob, out, ocs, res, rcs, p); break;
    }
    ob += ov;
  }
  if (p->post) kiln_ir_post(out, OCB, ocs, ncols, res_after, rcs, p->post);
}


#define KILN_IR_CTX KILN_IR_CAT(KILN_IR_FN, _ctx)
#define KILN_IR_TASKS KILN_IR_CAT(KILN_IR_FN, _tasks)
/* what a range of tasks reads (kiln_par_for's context) */
struct KILN_IR_CTX {
  const float* x; const float* w1; const float* b1; const float* w2; const float* b2; const float* w3;
  const float* b3; const float* r; float* y;
  int64_t ICB, H, W, ECB, OCB, OH, OW, KH, KW, sw, sh, pt, pl, bands, Wp, ICr, ECr, ECo, OCo;
  const int32_t* act; const float* lo; const float* hi;
  float* psum;          /* w3 NULL (KILN_IR_ED_FN): per task [ECB][L] sums of its rows, or NULL */
  int32_t failed;
};
/* tasks [lo, hi) (image, band of output rows), with a ring and a row of their own */
static void KILN_IR_TASKS(void* ctx_, int64_t t0, int64_t t1) {
  const struct KILN_IR_CTX* c = (const struct KILN_IR_CTX*)ctx_;
  enum { L = KILN_IR_L };
  const float* restrict x = c->x; const float* restrict w1 = c->w1; const float* restrict b1 = c->b1;
  const float* restrict w2 = c->w2; const float* restrict b2 = c->b2; const float* restrict w3 = c->w3;
  const float* restrict b3 = c->b3; const float* restrict r = c->r; float* restrict y = c->y;
  const int64_t ICB = c->ICB, H = c->H, W = c->W, ECB = c->ECB, OCB = c->OCB, OH = c->OH, OW = c->OW;
  const int64_t KH = c->KH, KW = c->KW, sh = c->sh, sw = c->sw, pt = c->pt, pl = c->pl, bands = c->bands;
  const int64_t ICr = c->ICr, ECr = c->ECr, ECo = c->ECo, OCo = c->OCo;
  const int32_t* act = c->act; const float* lo = c->lo; const float* hi = c->hi;
  const int64_t rowstride = c->Wp * L;                    /* floats per channel block of a row */
  const size_t rowbytes = (size_t)ECB * rowstride * sizeof(float);
  const size_t ringbytes = ((size_t)KH * rowbytes + 63) / 64 * 64;
  const size_t zbytes = (rowbytes + 63) / 64 * 64;
  const size_t dbytes = ((size_t)ECB * OW * L * sizeof(float) + 63) / 64 * 64;
  float* ring = (float*)aligned_alloc(64, ringbytes + zbytes + dbytes);
  if (!ring) {
    __atomic_store_n(&((struct KILN_IR_CTX*)ctx_)->failed, 1, __ATOMIC_RELAXED);
    return;
  }
  /* zero: the ring rows' padding columns (the expand writes columns pl .. pl + W - 1 of each
     block) and the row read above and below the image; the whole ring took 1-3% of a 56x56
     or 112x112 block (131 KB a call for 16 -> 96 on 112 columns) */
  const int64_t right = c->Wp - pl - W;
  for (int64_t k = 0; k < KH * ECB; ++k) {
    float* blk = ring + k * rowstride;
    __builtin_memset(blk, 0, (size_t)pl * L * sizeof(float));
    if (right > 0) __builtin_memset(blk + (pl + W) * L, 0, (size_t)right * L * sizeof(float));
  }
  __builtin_memset(ring + ringbytes / sizeof(float), 0, zbytes);
  const float* zero = ring + ringbytes / sizeof(float);
  float* drow = ring + (ringbytes + zbytes) / sizeof(float);
  for (int64_t task = t0; task < t1; ++task) {
    const int64_t n = task / bands, band = task % bands;
    const int64_t oh0 = band * OH / bands, oh1 = (band + 1) * OH / bands;
    int64_t held[16];
    for (int64_t k = 0; k < KH; ++k) held[k] = -1;
    const float* xn = x + n * ICB * H * W * L;
    for (int64_t oh = oh0; oh < oh1; ++oh) {
      const float* rows[16];
      for (int64_t kh = 0; kh < KH; ++kh) {
        const int64_t ih = oh * sh - pt + kh;
        if (ih < 0 || ih >= H) { rows[kh] = zero; continue; }
        float* slot = ring + (ih % KH) * (rowbytes / sizeof(float));
        if (held[ih % KH] != ih) {        /* expand input row ih into the ring */
          kiln_ir_pw_row(xn + ih * W * L, H * W * L, ICB, ICr, W, w1, b1, ECB, slot + pl * L, rowstride,
                         NULL, 0, ECo, act[0], lo[0], hi[0]);
          held[ih % KH] = ih;
        }
        rows[kh] = slot;
      }
      KILN_IR_DW(rows, rowstride, ECB, OW, KH, KW, sw, w2, b2, drow, act[1], lo[1], hi[1]);
      const int64_t yo = (n * OCB * OH + oh) * OW * L;
      if (w3) {
        kiln_ir_pw_row(drow, OW * L, ECB, ECr, OW, w3, b3, OCB, y + yo, OH * OW * L, r ? r + yo : NULL,
                       OH * OW * L, OCo, act[2], lo[2], hi[2]);
        continue;
      }
      for (int64_t e = 0; e < ECB; ++e) {       /* no project: the row to y, its sums to psum */
        const float* d = drow + e * OW * L;
        float* ye = y + ((n * ECB + e) * OH + oh) * OW * L;
        kiln_ir_v sum = {0};
        for (int64_t col = 0; col < OW; ++col) {
          const kiln_ir_v v = IR_LD(d + col * L);
          IR_ST(ye + col * L, v);
          sum += v;
        }
        if (c->psum) {
          float* ps = c->psum + (task * ECB + e) * L;
          IR_ST(ps, IR_LD(ps) + sum);
        }
      }
    }
  }
  free(ring);
}

__attribute__((weak, visibility("hidden"), noinline)) int32_t KILN_IR_FN(
    const float* restrict x, const float* restrict w1, const float* restrict b1,
    const float* restrict w2, const float* restrict b2, const float* restrict w3,
    const float* restrict b3, const float* restrict r, float* restrict y,
    int64_t N, int64_t ICB, int64_t H, int64_t W, int64_t ECB, int64_t OCB, int64_t OH, int64_t OW,
    int64_t KH, int64_t KW, int64_t sh, int64_t sw, int64_t pt, int64_t pl,
    int64_t ICr, int64_t ECr, int64_t ECo, int64_t OCo,
    const int32_t* act, const float* lo, const float* hi, int64_t bands, int par) {
  if (KH > 16) return -1;
  /* the ring's rows: every column a window reads, the padding columns zero */
  int64_t Wp = (OW - 1) * sw + KW;
  if (Wp < pl + W) Wp = pl + W;
  struct KILN_IR_CTX c = { x, w1, b1, w2, b2, w3, b3, r, y, ICB, H, W, ECB, OCB, OH, OW, KH, KW, sw, sh, pt, pl,
                           bands, Wp, ICr, ECr, ECo, OCo, act, lo, hi, NULL, 0 };
  kiln_par_for(KILN_IR_TASKS, &c, 0, N * bands, par);
  return c.failed ? -1 : 0;
}

__attribute__((weak, visibility("hidden"), noinline)) int32_t KILN_IR_ED_FN(
    const float* restrict x, const float* restrict w1, const float* restrict b1,
    const float* restrict w2, const float* restrict b2, float* restrict y, float* restrict m,
    int64_t N, int64_t ICB, int64_t H, int64_t W, int64_t ECB, int64_t OH, int64_t OW,
    int64_t KH, int64_t KW, int64_t sh, int64_t sw, int64_t pt, int64_t pl, int64_t ICr, int64_t ECo,
    const int32_t* act, const float* lo, const float* hi, int64_t bands, int par) {
  enum { L = KILN_IR_L };
  if (KH > 16) return -1;
  int64_t Wp = (OW - 1) * sw + KW;
  if (Wp < pl + W) Wp = pl + W;
  float* psum = NULL;
  if (m) {
    psum = (float*)aligned_alloc(64, ((size_t)N * bands * ECB * L * sizeof(float) + 63) / 64 * 64);
    if (!psum) return -1;
    __builtin_memset(psum, 0, (size_t)N * bands * ECB * L * sizeof(float));
  }
  struct KILN_IR_CTX c = { x, w1, b1, w2, b2, NULL, NULL, NULL, y, ICB, H, W, ECB, ECB, OH, OW, KH, KW, sw, sh,
                           pt, pl, bands, Wp, ICr, ECB * L, ECo, ECB * L, act, lo, hi, psum, 0 };
  kiln_par_for(KILN_IR_TASKS, &c, 0, N * bands, par);
  if (psum) {
    const float inv = 1.0f / (float)(OH * OW);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t e = 0; e < ECB; ++e) {
        kiln_ir_v s = {0};
        for (int64_t b = 0; b < bands; ++b) s += IR_LD(psum + ((n * bands + b) * ECB + e) * L);
        IR_ST(m + (n * ECB + e) * L, s * inv);
      }
    free(psum);
  }
  return c.failed ? -1 : 0;
}
#undef KILN_IR_TASKS
#undef KILN_IR_CTX
#endif
#undef KILN_IR_GROUP_ARGS
#undef KILN_IR_G1
#undef KILN_IR_G2
#undef KILN_IR_G3
#undef KILN_IR_G4
#undef KILN_IR_GH
#undef KILN_IR_DW
#undef KILN_IR_GROUP
#undef KILN_IR_PIECE
#undef KILN_IR_CAT
#undef KILN_IR_CAT2
#undef IR_LD
#undef IR_ST
#undef KILN_IR_ED_FN
#undef KILN_IR_ED_CAT
#undef KILN_IR_ED_CAT2
#undef KILN_IR_IN_REGISTER
