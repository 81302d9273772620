#ifndef KILN_RANDOM
#define KILN_RANDOM
/* The generators of kiln's random kernels (kiln.lower.random), NumPy's bit for bit. */

/* Fresh entropy for a node without a seed: w[0..3] from a call counter, the library's
   load address and the time-stamp counter (x86) through splitmix64, so calls and
   processes draw fresh values. */
static inline void kiln_entropy(uint64_t w[4]) {
  static uint64_t calls;
  uint64_t z = 0x6b696c6e2d726e67ULL ^ (uint64_t)(uintptr_t)&calls
               ^ (__atomic_fetch_add(&calls, 1, __ATOMIC_RELAXED) * 0x9E3779B97F4A7C15ULL);
#if defined(__x86_64__) || defined(__i386__)
  z ^= (uint64_t)__builtin_ia32_rdtsc() * 0xBF58476D1CE4E5B9ULL;
#endif
  for (int q = 0; q < 4; ++q) {  /* splitmix64 */
    uint64_t y = (z += 0x9E3779B97F4A7C15ULL);
    y = (y ^ (y >> 30)) * 0xBF58476D1CE4E5B9ULL;
    y = (y ^ (y >> 27)) * 0x94D049BB133111EBULL;
    w[q] = y ^ (y >> 31);
  }
}

/* NumPy's PCG64 (default_rng's bit generator): a 128-bit LCG with the XSL-RR output;
   kiln_pcg_draw is the next double as NumPy makes it ((u64 >> 11) * 2^-53). */
typedef struct { unsigned __int128 st, inc, mul; } kiln_pcg;
static inline double kiln_pcg_draw(kiln_pcg* g) {
  g->st = g->st * g->mul + g->inc;
  uint64_t x = (uint64_t)(g->st >> 64) ^ (uint64_t)g->st;
  const unsigned r = (unsigned)(g->st >> 122);
  x = (x >> r) | (x << ((64 - r) & 63));
  return (double)(x >> 11) * (1.0 / 9007199254740992.0);
}
/* NumPy's PCG64 multiplier, and a generator for a node without a seed: its state and (odd)
   increment from fresh entropy (kiln_entropy). A seeded node's starting state is computed by
   kiln.lower.random at compile time. */
#define KILN_PCG_MUL (((unsigned __int128)2549297995355413924ULL << 64) | 4865540595714422341ULL)
static inline kiln_pcg kiln_pcg_fresh(void) {
  uint64_t w[4];
  kiln_entropy(w);
  const kiln_pcg g = {((unsigned __int128)w[0] << 64) | w[1], ((unsigned __int128)w[2] << 64) | w[3] | 1, KILN_PCG_MUL};
  return g;
}

/* NumPy's legacy MT19937 as np.random.RandomState(seed) starts it; kiln_mt_draw is the
   next random_sample() double (two 32-bit draws, 53 bits). */
typedef struct { uint32_t mt[624]; int mti; } kiln_mt;
static inline void kiln_mt_seed(kiln_mt* g, uint32_t seed) {
  g->mt[0] = seed;
  for (int q = 1; q < 624; ++q) g->mt[q] = 1812433253U * (g->mt[q - 1] ^ (g->mt[q - 1] >> 30)) + (uint32_t)q;
  g->mti = 624;
}
static inline uint32_t kiln_mt_next(kiln_mt* g) {
  if (g->mti >= 624) {
    for (int q = 0; q < 624; ++q) {
      const uint32_t v = (g->mt[q] & 0x80000000U) | (g->mt[(q + 1) % 624] & 0x7fffffffU);
      g->mt[q] = g->mt[(q + 397) % 624] ^ (v >> 1) ^ ((v & 1U) ? 0x9908b0dfU : 0U);
    }
    g->mti = 0;
  }
  uint32_t y = g->mt[g->mti++];
  y ^= y >> 11; y ^= (y << 7) & 0x9d2c5680U;
  y ^= (y << 15) & 0xefc60000U; y ^= y >> 18;
  return y;
}
static inline double kiln_mt_draw(kiln_mt* g) {
  const uint32_t a = kiln_mt_next(g), b = kiln_mt_next(g);
  return ((double)(a >> 5) * 67108864.0 + (double)(b >> 6)) * (1.0 / 9007199254740992.0);
}
#endif
