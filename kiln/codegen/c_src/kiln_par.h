/* kiln_par_for: a hand-written kernel's parallel loop on the threads that run the module's
   generated loops: kiln's pool where the unit has it (kiln_pool.h or kiln_pool_decl.h before this file:
   KILN_THREADS_IMPL=pool, see kiln.codegen.csource.c_parallel), else OpenMP's team. So a model
   never has two teams of threads waiting for work side by side.

   fn(ctx, lo, hi) runs iterations [lo, hi) of the loop; the range is cut into contiguous
   chunks, a few per thread, claimed as threads come (a chunk sets up its own scratch: a
   kernel's per-thread buffers become per-chunk ones). `par` 0: one call over the whole range
   on the calling thread. */
#ifndef KILN_PAR_H
#define KILN_PAR_H
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#endif
typedef void (*kiln_par_fn)(void* ctx, int64_t lo, int64_t hi);
static inline void kiln_par_for(kiln_par_fn fn, void* ctx, int64_t lo, int64_t hi, int par) {
  const int64_t n = hi - lo;
  if (n <= 0) return;
  if (n == 1 || !par) { fn(ctx, lo, hi); return; }
#if defined(KILN_POOL_H) || defined(KILN_POOL_DECL_H)
  kiln_pool_for(fn, ctx, lo, hi);
#elif defined(_OPENMP)
  const int64_t most = 4 * (int64_t)omp_get_max_threads(), m = n < most ? n : most;
  #pragma omp parallel for schedule(dynamic, 1)
  for (int64_t c = 0; c < m; ++c) fn(ctx, lo + n * c / m, lo + n * (c + 1) / m);
#else
  fn(ctx, lo, hi);
#endif
}
/* the threads a kiln_par_for loop forked now would run on: kiln's pool says (kiln_pool_threads:
   1 while it is contended, or inside a chunk), else the OpenMP thread count */
static inline int kiln_par_threads(void) {
#if defined(KILN_POOL_H) || defined(KILN_POOL_DECL_H)
  return kiln_pool_threads();
#elif defined(_OPENMP)
  return omp_get_max_threads();
#else
#define KILN_PAR_STR(x) #x   /* (no string literal in generated code: kiln.codegen.c's rule) */
  const char* env = getenv(KILN_PAR_STR(OMP_NUM_THREADS));
  return env && atoi(env) > 0 ? atoi(env) : 1;
#endif
}
#endif
