/* The batched GEMM of the Winograd kernels (winograd.c, winograd1d.c): for each of NP
   transform positions t, M[t] = V[t] U[t] over a chunk of T tiles and one group of OV output
   channel blocks, in register blocks of TR tiles x OV vectors with the input channels
   innermost (per channel, OV weight vectors and TR broadcasts for TR * OV FMAs). Instantiated
   per register tile: define before this file
     KILN_WGG_FN   the function's name
     KILN_WGG_L    the channel block = the vector lanes
     KILN_WGG_TR   tiles per register block
     KILN_WGG_OV   channel blocks per register block
   u [NP][OCB][IC][L] transformed weights (this group's blocks start at og * OV), vbuf
   [NP][T][IC] transformed inputs, mbuf [NP][T][OV][L] out; T a multiple of TR. Always inlined:
   its loops unroll in the caller's as they did when they were written out there. */
static inline __attribute__((always_inline)) void KILN_WGG_FN(
    const float* restrict u, const float* restrict vbuf, float* restrict mbuf, int NP, int64_t OCB,
    int64_t og, int64_t T, int64_t IC) {
  typedef float V __attribute__((vector_size(KILN_WGG_L * 4)));
  enum { L = KILN_WGG_L, TR = KILN_WGG_TR, OV = KILN_WGG_OV };
  for (int t = 0; t < NP; ++t) {
    const float* ut = u + ((int64_t)t * OCB + og * OV) * IC * L;
    const float* vt = vbuf + (int64_t)t * T * IC;
    float* mt = mbuf + (int64_t)t * T * OV * L;
    for (int64_t j0 = 0; j0 < T; j0 += TR) {
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
