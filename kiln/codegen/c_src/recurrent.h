#ifndef KILN_RECURRENT_H
#define KILN_RECURRENT_H
#include <sched.h>
/* kiln::Recurrent: a team of threads (the members of one kiln_par_for job, on kiln's pool or
   OpenMP's team: one fork per kernel, not per step) claims the panels of every direction stage by stage (a
   stage is one product of a step: one per step, two for GRU without linear_before_reset). Each
   thread takes the panels of its own range first (their R stays in its core's cache from step
   to step), then whatever is left of the others' ranges: a partner that is late (waking up) or
   descheduled (a loaded machine) leaves its panels to the threads that run, and no thread ever
   waits for one that has claimed nothing. A range's claim word holds the stage it was last
   claimed in: the first claim of a stage opens it (every range is claimed from in every stage,
   so a word behind the caller's stage can only be behind by one, and the caller's stage is the
   current one). `done` counts panels finished over all stages: whoever finishes a stage's last
   panel publishes the next stage, and a thread that finds its stage over joins the current one.
   So a stage costs the threads one shared counter and one flag, their claims staying in their
   own cache lines. Only a panel claimed and not yet finished is waited for: KILN_REC_SPINS
   pauses (~50 us on Zen 4), then the waiter yields its core, which may be the one the claimer
   needs. */
#define KILN_REC_MAXPER 64   /* threads in a team at most */
#define KILN_REC_SHIFT 24    /* a claim word: (stage << KILN_REC_SHIFT) | next panel of the range */
#define KILN_REC_SPINS 2000
typedef struct { int64_t next; char pad[56]; } kiln_rec_slot;
typedef struct {
  int64_t stage; char pad0[56];   /* the stage in progress */
  int64_t done; char pad1[56];    /* panels finished, all stages so far */
  kiln_rec_slot slot[KILN_REC_MAXPER];
} kiln_rec_team __attribute__((aligned(64)));
/* what a member of the team reads: the kernel's inputs (in node order, NULL where absent), Y,
   the state, the claims; B and S (run-time values in a shape-generic module); the groups the
   batch rows are shared out in; the team's size; whether the members share the panels (else
   each runs one direction for one group of rows) */
typedef struct {
  const void* in[7]; float* out0; float* state; kiln_rec_team* team; int64_t B, S, groups; int team_n, split;
} kiln_rec_job;
/* the first panel of thread q's range, of np panels shared by per threads */
static inline int64_t kiln_rec_lo(int64_t np, int per, int q) { return (int64_t)q * np / per; }
static inline void kiln_rec_init(kiln_rec_team* t, int per, int64_t np) {
  t->stage = 0; t->done = 0;
  for (int q = 0; q < per && q < KILN_REC_MAXPER; ++q) t->slot[q].next = kiln_rec_lo(np, per, q);
}
/* a panel of `stage` for thread `part` (its own range first), or -1 when all are claimed;
   `mirror`: a range's k-th claim takes its k-th panel from the end (kiln_rec_panel) */
static inline int64_t kiln_rec_claim(kiln_rec_team* t, int per, int part, int64_t np, int64_t stage,
                                     int mirror) {
  const int64_t mask = ((int64_t)1 << KILN_REC_SHIFT) - 1;
  for (int k = 0; k < per; ++k) {
    const int q = part + k < per ? part + k : part + k - per;
    const int64_t lo = kiln_rec_lo(np, per, q), hi = kiln_rec_lo(np, per, q + 1);
    int64_t v = __atomic_load_n(&t->slot[q].next, __ATOMIC_RELAXED);
    while (lo < hi) {
      int64_t want, got;
      if ((v >> KILN_REC_SHIFT) == stage && (v & mask) < hi) { want = v + 1; got = v & mask; }
      else if ((v >> KILN_REC_SHIFT) < stage) { want = (stage << KILN_REC_SHIFT) | (lo + 1); got = lo; }
      else break;
      if (__atomic_compare_exchange_n(&t->slot[q].next, &v, want, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        return mirror ? lo + hi - 1 - got : got;
    }
  }
  return -1;
}
/* Panel order: a step streams R (its panels) front to back, the next step back to front. R
   that does not quite fit a core's L2 (an LSTM of 256 units: 1 MiB, which with the state and
   the projected inputs overfills a 1 MiB L2) would otherwise miss on every line, each step
   evicting what the next one reads first (LRU on a cyclic stream); turned around, the next
   step starts on the lines the last one left in L2 (one thread, reading 1 MiB again and again:
   96 -> 104 GB/s on the Zen 4 dev machine, 1.25 MiB 93 -> 99). Only while a thread streams
   at most TURN_L2 L2s a stage (kiln.lower.recurrent): of twice L2 too little stays, and the
   turned order measured slower. Panels are independent within a stage, so any order gives
   the same result. */
static inline int kiln_rec_mirror(int64_t stage, int64_t phases) { return (int)((stage / phases) & 1); }
/* this thread finished n panels of `stage`; returns the stage to go on with (waiting for the
   panels others claimed): whoever finishes the last panel publishes the next stage */
static inline int64_t kiln_rec_finish(kiln_rec_team* t, int64_t np, int64_t stage, int64_t n) {
  if (n && __atomic_add_fetch(&t->done, n, __ATOMIC_ACQ_REL) == (stage + 1) * np) {
    __atomic_store_n(&t->stage, stage + 1, __ATOMIC_RELEASE);
    return stage + 1;
  }
  int64_t s;
  for (int spins = 0; (s = __atomic_load_n(&t->stage, __ATOMIC_ACQUIRE)) == stage; ++spins) {
    if (spins < KILN_REC_SPINS) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
      continue;
    }
    sched_yield();
  }
  return s;
}
/* sigmoid and tanh inline, so a simd loop over a panel's units vectorises them with no call (a
   call would spill the live accumulators): sigmoid as kiln_sigmoid.h's kiln_sigmoid_f32 (one
   thread, LSTM of 256 units: 0.7% of the layer at batch 8 and 2.6% at batch 1 faster than
   Cephes' expf and a division), tanh as Eigen's rational 13/6 approximation (within 4e-7 of
   tanh, odd, exactly x near 0) */
/* v clamped to [lo, hi], NaN kept (as numpy.clip) */
static inline float kiln_rec_clamp(float v, float lo, float hi) { return v < lo ? lo : v > hi ? hi : v; }
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
#endif
