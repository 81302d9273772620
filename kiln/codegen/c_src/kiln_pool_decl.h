/* kiln's thread pool as a translation unit sees it that calls it but does not define it
   (kiln.codegen.csource.c_parallel, kiln.codegen.c.emit_c_units): every unit but one of a
   module, and the shared kernels' units. The module's first unit includes kiln_pool.h, which
   defines these (weak, hidden: one pool per library). Compiling the pool's definitions took
   0.1 s of CPU in every unit that held them. */
#ifndef KILN_POOL_H
#define KILN_POOL_H
#include <stdint.h>
typedef void (*kiln_pool_fn)(void* ctx, int64_t lo, int64_t hi);
#pragma GCC visibility push(hidden)
void kiln_pool_enter(void);
void kiln_pool_leave(void);
void kiln_pool_park(void);
void kiln_pool_unpark(void);
void kiln_pool_for(kiln_pool_fn fn, void* ctx, int64_t lo, int64_t hi);
#pragma GCC visibility pop
#endif
