/* kiln's thread pool as the translation units that call it see it (kiln.codegen.c: a module
   split into units; kiln.codegen.csource.c_parallel: the shared kernels' units). Its definitions
   (kiln_pool.h: weak, hidden, one pool per library) are a shared unit of their own
   (kiln.codegen.c.pool_block), compiled once per machine and linked into every module:
   compiled in every unit, they took 0.12 s of CPU in each. Both may be in one unit (an
   artifact's model.c), in either order. */
#ifndef KILN_POOL_DECL_H
#define KILN_POOL_DECL_H
typedef void (*kiln_pool_fn)(void* ctx, int64_t lo, int64_t hi);
#pragma GCC visibility push(hidden)
void kiln_pool_enter(void);
void kiln_pool_leave(void);
void kiln_pool_park(void);
void kiln_pool_unpark(void);
void kiln_pool_for(kiln_pool_fn fn, void* ctx, int64_t lo, int64_t hi);
int32_t kiln_pool_threads(void);
#pragma GCC visibility pop
#endif
