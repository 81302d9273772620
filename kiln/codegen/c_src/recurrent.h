#include <omp.h>
#include <sched.h>
/* kiln::Recurrent: a spin barrier for the threads sharing one direction, once per step.
   A wait that outlasts KILN_REC_SPINS pauses means a partner is not running (a loaded
   machine): the waiter yields its core, and the first to do so records the step in
   `solo`; from the step after, the group's first thread goes on alone (see the kernel). */
typedef struct { int count; int gen; int64_t solo; char pad[48]; } kiln_rec_barrier __attribute__((aligned(64)));
#define KILN_REC_SPINS 2000
static inline void kiln_rec_wait(kiln_rec_barrier* b, int n, int64_t step) {
  const int gen = __atomic_load_n(&b->gen, __ATOMIC_ACQUIRE);
  if (__atomic_add_fetch(&b->count, 1, __ATOMIC_ACQ_REL) == n) {
    __atomic_store_n(&b->count, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&b->gen, gen + 1, __ATOMIC_RELEASE);
    return;
  }
  for (int spins = 0; __atomic_load_n(&b->gen, __ATOMIC_ACQUIRE) == gen; ++spins) {
    if (spins < KILN_REC_SPINS) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
      continue;
    }
    int64_t none = 0;
    __atomic_compare_exchange_n(&b->solo, &none, step + 1, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    sched_yield();
  }
}
/* exp, sigmoid and tanh inline, so a simd loop over a panel's units vectorises them with no
   call (a call would spill the live accumulators): exp as kiln_exp.h's (Cephes' expf),
   tanh as Eigen's rational 13/6 approximation (within 4e-7 of tanh, odd, exactly x near 0) */
/* v clamped to [lo, hi], NaN kept (as numpy.clip) */
static inline float kiln_rec_clamp(float v, float lo, float hi) { return v < lo ? lo : v > hi ? hi : v; }
static inline float kiln_rec_exp(float x) {
  return kiln_exp_clamped(x < -87.3f ? -87.3f : x > 88.0f ? 88.0f : x);  /* (fminf / fmaxf would be calls) */
}
static inline float kiln_rec_sigmoid(float x) { return 1.0f / (1.0f + kiln_rec_exp(-x)); }
static inline float kiln_rec_tanh(float x) {
  const float m = 7.90531110763549805f, c = x < -m ? -m : x > m ? m : x, x2 = c * c;
  float p = -2.76076847742355e-16f;
  p = p * x2 + 2.00018790482477e-13f; p = p * x2 + -8.60467152213735e-11f;
  p = p * x2 + 5.12229709037114e-08f; p = p * x2 + 1.48572235717979e-05f;
  p = p * x2 + 6.37261928875436e-04f; p = p * x2 + 4.89352455891786e-03f;
  float q = 1.19825839466702e-06f;
  q = q * x2 + 1.18534705686654e-04f; q = q * x2 + 2.26843463243900e-03f; q = q * x2 + 4.89352518554385e-03f;
  return fabsf(x) < 0.0004f ? x : c * p / q;
}
/* whether the group goes on with one thread after the barrier of `step`: a wait of an
   earlier step was slow (its flag was set before every thread arrived here, so all agree) */
static inline int kiln_rec_solo(kiln_rec_barrier* b, int64_t step) {
  const int64_t f = __atomic_load_n(&b->solo, __ATOMIC_RELAXED);
  return f != 0 && f - 1 < step;
}
