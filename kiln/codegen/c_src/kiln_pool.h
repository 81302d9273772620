/* kiln's thread pool (kiln.runtime.threads, KILN_THREADS_IMPL=pool): fork/join for the
   generated code's parallel loops and the hand-written kernels' (kiln_par_for), with threads
   that spin a bounded time and then sleep.

   - An idle worker spins on the job word for at most KILN_POOL_SPIN_US (100 us) after its last
     chunk, inside an inference or between two (a pause, and sched_yield every few
     microseconds so a worker sharing a core with the thread it waits for hands the core
     over); then it sleeps on a futex and costs nothing. The model's entry (kiln_pool_enter)
     wakes sleeping workers, so back-to-back inferences find them spinning.
   - Spinning pays only where the workers have cores to themselves. The pool is contended when
     a spinning worker finds it was descheduled (200 us between two looks at the clock), a
     woken worker ran 1 ms after its wake-up, or the caller's wait at a join was
     descheduled: the machine is busy, or other threads (another runtime's spinning pool)
     share the cores. A worker that saw the first two claims no chunk of the loop open then.
     Contended for 10 ms: meanwhile parallel loops run on the calling thread alone and the
     workers sleep. On a busy machine a worker holds the chunks it claimed while the scheduler
     keeps it waiting (each such wait costs the caller a time slice at a join: mobilenet_v2
     batch 1 at load 15, 40-55 ms with 5 ms calms against 7.3 ms with no worker); one
     thread's loops never wait. Such a stall (a worker off its core 1 ms while it held
     chunks: its wall time less its CPU time) doubles the calm (to 1 s) while it recurs within
     a second; the other signs do not, so a peer's spin that ends costs the pool its workers
     for 10 ms more, not seconds.
   - The caller waits at a join by a pause loop of at most 100 us (10 us when contended), then
     sleeps until the last chunk ends (it never yields: on a busy machine sched_yield gives a
     whole time slice away).
   - A fork wakes sleeping workers once: not again until a woken worker runs or 1 ms passed
     (the wake-up takes 10-50 us, during which the caller's loops would each pay a futex call).
   - A parallel loop is cut into contiguous chunks (a few per thread) claimed from one atomic
     word; the calling thread claims chunks too, and the join waits only for chunks that were
     claimed and are not finished. A worker that is late (asleep, descheduled on a loaded
     machine) leaves its chunks to the caller: the caller never waits for a worker to start.
   - Kernels that still fork OpenMP's team are bracketed by kiln_pool_park/unpark: the pool's
     workers sleep meanwhile, so two teams never spin against each other for the cores.
   - Each worker is pinned to one CPU of the process's mask where the pool fills it, never to
     the one the caller runs on (kiln_pool_cpu; the caller itself is never pinned): the caller
     checks its CPU at each entry and fork (sched_getcpu, a few ns), and should it have moved
     to a worker's CPU, that worker moves to the CPU the caller left (kiln_pool_place, one
     system call). A spinning worker descheduled, or woken late, leaves a sign that the caller
     reads at its next fork (kiln_pool_settle): contention, unless the caller is on that
     worker's CPU (then the worker only gave the caller its turn: it moves instead). Before,
     a caller the scheduler put on the worker's CPU stayed there, the worker read its turns
     as contention, and the loops ran on the caller alone (tiny_cnn batch 8: 88% of them).
     Workers: the OpenMP thread count (OMP_NUM_THREADS, omp_get_max_threads) minus one,
     created at the first parallel loop; one thread: none.
   - One pool per library (weak hidden symbols: one copy whatever the translation units).
     One thread at a time holds it (a try-lock at the entry); another thread running the same
     library meanwhile runs its loops inline. Loops inside a chunk run inline. The workers are
     joined when the library is unloaded, and forgotten in a fork()ed child (made again there).
   The job word: generation (32 bits) | chunks (16) | next chunk (16); a chunk is claimed by a
   compare-and-swap on it, so a worker never runs a chunk of a job other than the one it read. */
#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <limits.h>
#include <stdio.h>
#if defined(__linux__)
#include <unistd.h>
#include <sys/syscall.h>
#include <linux/futex.h>
#endif
#if defined(__linux__) && defined(__GLIBC__)
extern int sched_getcpu(void);   /* (declared by <sched.h> under _GNU_SOURCE only) */
#endif
#ifdef _OPENMP
#include <omp.h>
#endif
#ifndef KILN_POOL_H
#define KILN_POOL_H
#define KILN_POOL_MAX 256          /* workers at most */
#define KILN_POOL_STR(x) #x        /* (no string literal in generated code: kiln.codegen.c's rule) */
#define KILN_POOL_CHUNKS 4         /* chunks per thread in a parallel loop (KILN_POOL_CHUNKS) */
#define KILN_POOL_GAP_NS 200000    /* a spinning worker descheduled this long: contended */
#define KILN_POOL_CALM_NS 10000000 /* ... for this long, doubled (to 1 s) while it recurs */
#define KILN_POOL_CALM_MAX_NS 1000000000
#define KILN_POOL_JOIN_NS 100000   /* the caller's pause loop at a join, then it sleeps */
#define KILN_POOL_JOIN_BUSY_NS 10000   /* ... when contended */
#define KILN_POOL_REWAKE_NS 1000000    /* a wake-up no worker answered is sent again after this */
#define KILN_POOL_LATE_NS 1000000      /* a worker running this long after its wake-up: contended (KILN_POOL_LATE_US) */
#define KILN_POOL_STALL_NS 1000000     /* a worker kept off its core this long while it held chunks: stalled */
#define KILN_POOL_TIMED 16             /* threads timed apart under KILN_POOL_TIMES (more share the last) */
typedef void (*kiln_pool_fn)(void* ctx, int64_t lo, int64_t hi);
typedef struct {
  uint64_t word __attribute__((aligned(64)));  /* gen | chunks | next */
  uint32_t done __attribute__((aligned(64)));  /* chunks of the current job finished (a futex) */
  uint32_t joining;                            /* the caller sleeps until `done` changes */
  int64_t calm_after;                          /* contended until then (ns): workers do not spin */
  kiln_pool_fn fn; void* ctx; int64_t lo, n;   /* the current job (written before `word`) */
  uint32_t active __attribute__((aligned(64))); /* 1 inside an inference */
  uint32_t parked;                             /* an OpenMP kernel runs: workers sleep at once */
  uint32_t wake;                               /* futex word: bumped to wake sleepers */
  int64_t woke_at;                             /* when the last wake-up was sent (ns) */
  uint32_t pending;                            /* woken, and none of them has run yet */
  int32_t sleepers, stop, owner, state;        /* state: 0 none, 1 starting, 2 running */
  int32_t nworkers; int64_t spin_ns, calm_ns, calm_cur, late_ns, chunks; uint32_t gen;
  int32_t placed, team; unsigned long cpus[16];   /* workers pinned so far; threads; the CPU mask */
  /* counts (KILN_POOL_STATS=1 prints them at unload): loops forked, run alone while contended;
     contended after a descheduled spin, a late wake-up, a descheduled join */
  uint64_t forks, alone, by_spin, by_wake, by_join;
  /* ... a worker off its core 1 ms while it held chunks (a stall: the only kind that
     lengthens the calm) */
  uint64_t by_stall;
  /* ... workers gone to sleep inside an inference (a serial stretch over spin_ns), loops that
     woke them, loops whose chunks the caller ran all (no worker came in time) */
  uint64_t naps, loop_wakes, solo;
  /* ... workers moved off the caller's CPU; signs dropped as the caller's turn on a worker's CPU */
  uint64_t moved, shared;
  /* a worker's sign of contention for the caller to judge: when (us) << 17 | spin 0, wake 1 << 16
     | the worker's CPU; 0: none */
  uint64_t sign __attribute__((aligned(64)));
  int32_t spare;                               /* the CPU no worker holds (-1: workers not pinned) */
  int32_t cpu_of[KILN_POOL_MAX];               /* each worker's CPU (by start order), -1: none */
  int32_t tids[KILN_POOL_MAX];                 /* each worker's thread id (0 until it runs) */
  pthread_t threads[KILN_POOL_MAX];
  /* KILN_POOL_TIMES=1 (wall clock) or 2 (each thread's CPU clock): per thread (0: the caller,
     then the workers by start order), ns inside chunks and chunks run; the caller's ns inside
     its forks, and of those, ns after its last chunk until the join (kiln_pool_times) */
  int32_t timing;
  int32_t serial;   /* KILN_POOL_SERIAL=1: the caller runs every chunk of a loop, in order (what cutting costs) */
  struct { uint64_t ns __attribute__((aligned(64))), chunks, fork_ns, join_ns; } times[KILN_POOL_TIMED];   /* (a line each) */
} kiln_pool_t;
#pragma GCC visibility push(hidden)
__attribute__((weak)) kiln_pool_t kiln_pool;
__attribute__((weak)) __thread int32_t kiln_pool_depth = 0;   /* entries on this thread */
__attribute__((weak)) __thread int32_t kiln_pool_held = 0;    /* this thread holds the pool */
__attribute__((weak)) __thread int32_t kiln_pool_inline = 0;  /* in a chunk (or a worker): loops run inline */
__attribute__((weak)) __thread int32_t kiln_pool_me = 0;      /* 0: a caller; a worker's number */

static inline void kiln_pool_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__(KILN_POOL_STR(yield));
#endif
}
static inline int64_t kiln_pool_now(void) {
  struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}
/* this thread's CPU time (ns; 0 where there is no such clock: no stall is seen) */
static inline int64_t kiln_pool_cpu_now(void) {
#if defined(CLOCK_THREAD_CPUTIME_ID)
  struct timespec t;
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t) == 0) return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
#endif
  return 0;
}
/* KILN_POOL_TIMES's clock */
static inline int64_t kiln_pool_clock(const kiln_pool_t* p) { return p->timing == 2 ? kiln_pool_cpu_now() : kiln_pool_now(); }
static inline void kiln_pool_sleep(uint32_t* word, uint32_t seen) {
#if defined(__linux__)
  syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, seen, (void*)0, (void*)0, 0);
#else
  if (__atomic_load_n(word, __ATOMIC_ACQUIRE) == seen) { struct timespec t = {0, 50000}; nanosleep(&t, 0); }
#endif
}
static inline void kiln_pool_wake_one(uint32_t* word) {
#if defined(__linux__)
  syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, 1, (void*)0, (void*)0, 0);
#endif
}
static inline void kiln_pool_wake_all(kiln_pool_t* p) {
  /* (again after 1 ms: a wake-up sent as the worker went to sleep may have found no sleeper) */
  const int64_t t = kiln_pool_now();
  if (__atomic_load_n(&p->pending, __ATOMIC_SEQ_CST) && t - __atomic_load_n(&p->woke_at, __ATOMIC_RELAXED) < KILN_POOL_REWAKE_NS
      && !__atomic_load_n(&p->stop, __ATOMIC_SEQ_CST)) return;
  __atomic_store_n(&p->woke_at, t, __ATOMIC_RELAXED);
  __atomic_store_n(&p->pending, 1, __ATOMIC_SEQ_CST);
  __atomic_fetch_add(&p->wake, 1, __ATOMIC_SEQ_CST);
#if defined(__linux__)
  syscall(SYS_futex, &p->wake, FUTEX_WAKE_PRIVATE, INT_MAX, (void*)0, (void*)0, 0);
#endif
}
/* A thread of the pool was descheduled: its loops run on the caller alone for a while. Only a
   stall (a worker the scheduler kept off its core while it held chunks: what makes the caller
   wait at a join) lengthens the calm, doubled each time it recurs within a second of the last calm's end (a
   busy machine), from calm_ns again after that (a blip). The other signs (a spinning worker
   descheduled, a late wake-up, the caller descheduled at a join) cost the caller nothing, as a
   worker that saw one claims no chunk of the loop open then: they give calm_ns, so the pool
   has its worker back within calm_ns of a peer's spin ending (ONNX Runtime's threads spin
   2^20 pauses after each run, tens of ms), where doubling on them had kept it serial 1 s. */
static inline void kiln_pool_contended(kiln_pool_t* p, int64_t t, int32_t stall) {
  int64_t calm = __atomic_load_n(&p->calm_cur, __ATOMIC_RELAXED);
  const int64_t after = __atomic_load_n(&p->calm_after, __ATOMIC_RELAXED);
  if (!stall) {
    if (after < t + p->calm_ns) __atomic_store_n(&p->calm_after, t + p->calm_ns, __ATOMIC_RELAXED);
    return;
  }
  calm = t - after < 1000000000 ? 2 * calm : 0;
  calm = calm < p->calm_ns ? p->calm_ns : calm > KILN_POOL_CALM_MAX_NS ? KILN_POOL_CALM_MAX_NS : calm;
  __atomic_store_n(&p->calm_cur, calm, __ATOMIC_RELAXED);
  __atomic_store_n(&p->calm_after, t + calm, __ATOMIC_RELAXED);
}
static inline int kiln_pool_open(uint64_t w) { return (w & 0xFFFF) < ((w >> 16) & 0xFFFF); }
/* Where chunk k of m over n iterations starts (k = m: n): the n % m chunks of one iteration
   more come first, so the threads claim the larger ones first and the last claims even out
   (n = 14 in 8 chunks: 2,2,2,2,2,2,1,1; alternating sizes, 1,2,2,2,1,2,2,2, left a thread
   one iteration behind at the join: 8 of 14 against 7, simulated on MobileNetV2's 1x1 convs at
   7x7 and 14x14 where n is 14-35 rows, about 3% of its 2-thread time at batch 1). */
static inline int64_t kiln_pool_chunk(int64_t n, int64_t m, int64_t k) {
  return n / m * k + (k < n % m ? k : n % m);
}
static inline int kiln_pool_calm(kiln_pool_t* p, int64_t t) { return t < __atomic_load_n(&p->calm_after, __ATOMIC_RELAXED); }

/* Runs chunk k of m of the current job (claimed: the job stays until it is done). */
static inline void kiln_pool_chunk_run(kiln_pool_t* p, int64_t k, int64_t m) {
  kiln_pool_fn fn = __atomic_load_n(&p->fn, __ATOMIC_RELAXED);
  void* ctx = __atomic_load_n(&p->ctx, __ATOMIC_RELAXED);
  int64_t lo = __atomic_load_n(&p->lo, __ATOMIC_RELAXED), n = __atomic_load_n(&p->n, __ATOMIC_RELAXED);
  const int64_t t0 = p->timing ? kiln_pool_clock(p) : 0;
  fn(ctx, lo + kiln_pool_chunk(n, m, k), lo + kiln_pool_chunk(n, m, k + 1));
  if (t0) {
    const int32_t s = kiln_pool_me < KILN_POOL_TIMED ? kiln_pool_me : KILN_POOL_TIMED - 1;
    __atomic_fetch_add(&p->times[s].ns, (uint64_t)(kiln_pool_clock(p) - t0), __ATOMIC_RELAXED);
    __atomic_fetch_add(&p->times[s].chunks, 1, __ATOMIC_RELAXED);
  }
  __atomic_fetch_add(&p->done, 1, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&p->joining, __ATOMIC_SEQ_CST)) kiln_pool_wake_one(&p->done);
}
/* Claims and runs chunks of the job `w` was read from, until none is left. */
__attribute__((weak)) int64_t kiln_pool_run(kiln_pool_t* p, uint64_t w) {
  const uint64_t gen = w >> 32;
  const int64_t m = (int64_t)((w >> 16) & 0xFFFF);
  int64_t ran = 0;
  while ((w >> 32) == gen && kiln_pool_open(w)) {
    if (!__atomic_compare_exchange_n(&p->word, &w, w + 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) continue;
    kiln_pool_chunk_run(p, (int64_t)(w & 0xFFFF), m);
    w = __atomic_load_n(&p->word, __ATOMIC_ACQUIRE);
    ran += 1;
  }
  return ran;
}

/* Workers are pinned to the CPUs of the process's mask other than the caller's (the caller's
   thread is never pinned): woken after an idle spell (a server between requests), an unpinned
   worker was placed on the caller's core (wake-affine) and shared it for several runs, at one
   thread's speed (transformer layer 4x64 after 50 ms idle: 4.9 ms unpinned, 2.8 pinned, 2.5
   without the idle). Only a pool whose `team` (workers and caller) fills the mask is pinned:
   each loaded library has a pool of its own and no pool knows another's CPUs, so two models
   run at once from two threads with OMP_NUM_THREADS at half the CPUs would pin both teams to
   the first half and leave the rest idle; unpinned, the scheduler spreads them. (A thread
   given a CPU set of its own, sched_setaffinity, gives its pool that mask: pools of threads on
   disjoint sets stay apart.) ONNX Runtime pins its default pool's threads to every core but
   the first and leaves the caller unpinned, which assumes the caller stays on the first core;
   OpenMP bound (OMP_PROC_BIND) pins the caller too. kiln does neither: the CPU the caller runs
   on stays free (the spare), and moves with it (kiln_pool_place).
   The CPU for worker `me` (1, 2, ...; 0: the spare) when the caller runs on CPU `caller`, or
   -1: not pinned. The mask's CPUs in order, the caller's (else the first) taken out to lead. */
static inline int32_t kiln_pool_cpu(const unsigned long* cpus, int32_t me, int32_t team, int32_t caller) {
  int32_t n = 0, first = -1;
  const int32_t bits = (int32_t)(8 * sizeof cpus[0]);
  for (int32_t c = 0; c < 16 * bits; ++c)
    if ((cpus[c / bits] >> (c % bits)) & 1) { n += 1; if (first < 0) first = c; }
  if (n < 2 || team < n) return -1;
  const int32_t lead = caller >= 0 && caller < 16 * bits && ((cpus[caller / bits] >> (caller % bits)) & 1) ? caller : first;
  if (me % n == 0) return lead;
  for (int32_t c = 0, seen = 0; c < 16 * bits; ++c)
    if (c != lead && ((cpus[c / bits] >> (c % bits)) & 1) && ++seen == me % n) return c;
  return -1;
}
/* the CPU this thread runs on (-1: unknown) */
static inline int32_t kiln_pool_getcpu(void) {
#if defined(__linux__) && defined(__GLIBC__)
  return (int32_t)sched_getcpu();
#else
  return -1;
#endif
}
static inline void kiln_pool_bind(int32_t tid, int32_t c) {
#if defined(__linux__)
  const int32_t bits = (int32_t)(8 * sizeof(unsigned long));
  unsigned long one[16] = {0};
  one[c / bits] = 1UL << (c % bits);
  syscall(SYS_sched_setaffinity, tid, sizeof one, one);
#endif
}
/* A worker, as it starts: its number (1, 2, ...), its thread id recorded and it pinned to its
   CPU; again while the caller moved it meanwhile (the caller pins a worker whose id it sees). */
static inline int32_t kiln_pool_pin(kiln_pool_t* p) {
  const int32_t me = __atomic_fetch_add(&p->placed, 1, __ATOMIC_RELAXED) + 1;
#if defined(__linux__)
  __atomic_store_n(&p->tids[me - 1], (int32_t)syscall(SYS_gettid), __ATOMIC_SEQ_CST);
  for (int32_t c = -1;;) {
    const int32_t want = __atomic_load_n(&p->cpu_of[me - 1], __ATOMIC_SEQ_CST);
    if (want < 0 || want == c) break;
    kiln_pool_bind(0, want);
    c = want;
  }
#endif
  return me;
}
/* By the thread holding the pool, on CPU `c`: a worker pinned to it moves to the spare CPU (the
   one the caller left), which `c` becomes. Whether one moved. */
static inline int kiln_pool_place(kiln_pool_t* p, int32_t c) {
  const int32_t spare = __atomic_load_n(&p->spare, __ATOMIC_RELAXED);
  if (spare < 0 || c < 0 || c == spare) return 0;
  for (int32_t i = 0; i < p->nworkers; ++i) {
    if (__atomic_load_n(&p->cpu_of[i], __ATOMIC_RELAXED) != c) continue;
    __atomic_store_n(&p->cpu_of[i], spare, __ATOMIC_SEQ_CST);
    __atomic_store_n(&p->spare, c, __ATOMIC_RELAXED);
    const int32_t tid = __atomic_load_n(&p->tids[i], __ATOMIC_SEQ_CST);
    if (tid > 0) kiln_pool_bind(tid, spare);
    __atomic_fetch_add(&p->moved, 1, __ATOMIC_RELAXED);
    return 1;
  }
  return 0;
}
/* A worker's sign of contention at time t (kind 0: descheduled while it spun, 1: woken late):
   judged by the caller at its next fork where the workers are pinned, else contention now. */
static inline void kiln_pool_sign(kiln_pool_t* p, int64_t t, int32_t kind, int32_t me) {
  const int32_t cpu = __atomic_load_n(&p->spare, __ATOMIC_RELAXED) < 0 || me > KILN_POOL_MAX ? -1
                      : __atomic_load_n(&p->cpu_of[me - 1], __ATOMIC_RELAXED);
  if (cpu < 0) {
    kiln_pool_contended(p, t, 0);
    __atomic_fetch_add(kind ? &p->by_wake : &p->by_spin, 1, __ATOMIC_RELAXED);
    return;
  }
  __atomic_store_n(&p->sign, ((uint64_t)(t / 1000) << 17) | ((uint64_t)kind << 16) | (uint64_t)cpu, __ATOMIC_RELEASE);
}
/* By the thread holding the pool, at an entry and a fork: a worker's sign is contention unless
   this thread runs on that worker's CPU (the worker gave it its turn); a worker on this thread's
   CPU moves off it. */
static inline void kiln_pool_settle(kiln_pool_t* p) {
  if (__atomic_load_n(&p->spare, __ATOMIC_RELAXED) < 0) return;
  const int32_t c = kiln_pool_getcpu();
  uint64_t s = __atomic_load_n(&p->sign, __ATOMIC_ACQUIRE);
  if (s) s = __atomic_exchange_n(&p->sign, 0, __ATOMIC_ACQ_REL);
  if (s && (int32_t)(s & 0xFFFF) == c) {
    __atomic_fetch_add(&p->shared, 1, __ATOMIC_RELAXED);
  } else if (s) {
    kiln_pool_contended(p, (int64_t)(s >> 17) * 1000, 0);
    __atomic_fetch_add((s >> 16) & 1 ? &p->by_wake : &p->by_spin, 1, __ATOMIC_RELAXED);
  }
  kiln_pool_place(p, c);
}

__attribute__((weak)) void* kiln_pool_worker(void* arg) {
  kiln_pool_t* p = (kiln_pool_t*)arg;
  kiln_pool_inline = 1;
  const int32_t me = kiln_pool_pin(p);
  kiln_pool_me = me;
  int64_t idle_since = kiln_pool_now(), last = idle_since;
  /* after a sign of contention the worker leaves the loop open then (generation `skip`) to
     the caller: one the scheduler keeps waiting would hold the chunks it claimed */
  uint32_t skip = 0, skipping = 0, rest = 0;   /* rest: a sign left, sleep (not spin) */
  /* a stall: wall time less the thread's CPU time over a long run, from a base taken after each
     sleep and before a run more than STALL_NS after it (a system call: not one per run) */
  int64_t wall_base = idle_since, cpu_base = kiln_pool_cpu_now();
  for (uint32_t k = 1;; ++k) {
    uint64_t w = __atomic_load_n(&p->word, __ATOMIC_ACQUIRE);
    if (kiln_pool_open(w) && !(skipping && (uint32_t)(w >> 32) == skip)) {
      skipping = 0;
      const int64_t began = kiln_pool_now();
      if (began - wall_base > KILN_POOL_STALL_NS) { wall_base = began; cpu_base = kiln_pool_cpu_now(); }
      kiln_pool_run(p, w);
      idle_since = last = kiln_pool_now();
      if (idle_since - began > KILN_POOL_STALL_NS) {   /* a long run: was it off its core? */
        const int64_t cpu = kiln_pool_cpu_now();
        if ((idle_since - wall_base) - (cpu - cpu_base) > KILN_POOL_STALL_NS) {
          kiln_pool_contended(p, idle_since, 1);
          __atomic_fetch_add(&p->by_stall, 1, __ATOMIC_RELAXED);
        }
        wall_base = idle_since; cpu_base = cpu;
      }
      continue;
    }
    if (__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE)) return 0;
    if (!__atomic_load_n(&p->parked, __ATOMIC_RELAXED)) {
      kiln_pool_pause();
      if (k % 16 != 0) continue;
      int64_t t = kiln_pool_now();
      if (t - last > KILN_POOL_GAP_NS) {   /* descheduled meanwhile: stop spinning for a while */
        kiln_pool_sign(p, t, 0, me);
        skip = (uint32_t)(__atomic_load_n(&p->word, __ATOMIC_ACQUIRE) >> 32); skipping = 1; rest = 1;
      }
      last = t;
      if (t - idle_since < p->spin_ns && !kiln_pool_calm(p, t) && !rest) {
        sched_yield();   /* hands the core over to a thread that shares it (the caller, say) */
        continue;
      }
    }
    /* sleep: parked, contended, or no work for spin_ns */
    uint32_t seen = __atomic_load_n(&p->wake, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&p->active, __ATOMIC_RELAXED)) __atomic_fetch_add(&p->naps, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&p->sleepers, 1, __ATOMIC_SEQ_CST);
    w = __atomic_load_n(&p->word, __ATOMIC_SEQ_CST);
    if (!(kiln_pool_open(w) && !(skipping && (uint32_t)(w >> 32) == skip)) && !__atomic_load_n(&p->stop, __ATOMIC_SEQ_CST))
      kiln_pool_sleep(&p->wake, seen);
    __atomic_fetch_sub(&p->sleepers, 1, __ATOMIC_SEQ_CST);
    rest = 0;
    idle_since = last = wall_base = kiln_pool_now();
    cpu_base = kiln_pool_cpu_now();
    /* the first worker to run after a wake-up: a late one means the cores are busy */
    if (__atomic_exchange_n(&p->pending, 0, __ATOMIC_SEQ_CST)
        && idle_since - __atomic_load_n(&p->woke_at, __ATOMIC_RELAXED) > p->late_ns) {
      kiln_pool_sign(p, idle_since, 1, me);
      skip = (uint32_t)(__atomic_load_n(&p->word, __ATOMIC_ACQUIRE) >> 32); skipping = 1; rest = 1;
    }
  }
}

/* Stops and joins the workers (idempotent: every unit's destructor entry calls it). */
__attribute__((weak)) void kiln_pool_stop(void) {
  kiln_pool_t* p = &kiln_pool;
  int32_t running = 2;
  if (!__atomic_compare_exchange_n(&p->state, &running, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) return;
  const char* stats = getenv(KILN_POOL_STR(KILN_POOL_STATS));
  if (stats && atoi(stats) > 0)
    fprintf(stderr, KILN_POOL_STR(kiln_pool: %llu loops forked; %llu run alone while contended; contended by spin %llu wake %llu join %llu stall %llu; workers asleep inside an inference %llu and woken by a loop %llu; loops the caller ran all chunks of %llu),
            (unsigned long long)p->forks, (unsigned long long)p->alone, (unsigned long long)p->by_spin,
            (unsigned long long)p->by_wake, (unsigned long long)p->by_join, (unsigned long long)p->by_stall,
            (unsigned long long)p->naps,
            (unsigned long long)p->loop_wakes, (unsigned long long)p->solo);
  if (stats && atoi(stats) > 0) fputc(10, stderr);
  __atomic_store_n(&p->stop, 1, __ATOMIC_SEQ_CST);
  kiln_pool_wake_all(p);
  for (int32_t i = 0; i < p->nworkers; ++i) pthread_join(p->threads[i], 0);
  p->nworkers = 0;
  __atomic_store_n(&p->stop, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&p->state, 0, __ATOMIC_RELEASE);
}
__attribute__((weak, destructor)) void kiln_pool_unload(void) { kiln_pool_stop(); }
/* KILN_POOL_STATS's counts read from Python (kiln.runtime.threads.pool_counts; exported, where
   the rest of the pool is hidden): forks, alone, by_spin, by_wake, by_join, by_stall, naps,
   loop_wakes, solo, whether the pool is contended now, moved, shared into out[0..n); returns how
   many it has */
#pragma GCC visibility push(default)
__attribute__((weak)) int32_t kiln_pool_counts(uint64_t* out, int32_t n) {
  kiln_pool_t* p = &kiln_pool;
  const uint64_t c[12] = {p->forks, p->alone, p->by_spin, p->by_wake, p->by_join, p->by_stall, p->naps, p->loop_wakes,
                          p->solo, (uint64_t)kiln_pool_calm(p, kiln_pool_now()), p->moved, p->shared};
  for (int32_t k = 0; k < n && k < 12; ++k) out[k] = c[k];
  return 12;
}
/* KILN_POOL_TIMES's figures into out[0..n): per thread (caller first) ns in chunks, chunks,
   ns in forks, ns at joins (the last two the caller's only); returns how many it has */
__attribute__((weak)) int32_t kiln_pool_times(uint64_t* out, int32_t n) {
  kiln_pool_t* p = &kiln_pool;
  for (int32_t k = 0; k < n && k < 4 * KILN_POOL_TIMED; ++k) {
    const int32_t s = k / 4, f = k % 4;
    out[k] = f == 0 ? p->times[s].ns : f == 1 ? p->times[s].chunks : f == 2 ? p->times[s].fork_ns : p->times[s].join_ns;
  }
  return 4 * KILN_POOL_TIMED;
}
#pragma GCC visibility pop
/* a fork()ed child has none of the parent's workers (and no other thread holds the pool) */
__attribute__((weak)) void kiln_pool_forked(void) {
  kiln_pool_t* p = &kiln_pool;
  p->nworkers = 0; p->state = 0; p->stop = 0; p->sleepers = 0; p->owner = 0; p->active = 0; p->pending = 0;
  p->parked = 0; p->sign = 0;
  kiln_pool_depth = 0; kiln_pool_held = 0; kiln_pool_inline = 0;
}

/* The threads the user asked for: the OpenMP thread count (OMP_NUM_THREADS without OpenMP), 1 unset. */
static inline int64_t kiln_pool_asked(void) {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  const char* env = getenv(KILN_POOL_STR(OMP_NUM_THREADS));
  return env && atoi(env) > 0 ? atoi(env) : 1;
#endif
}

/* Starts the workers (by the thread holding the pool). */
__attribute__((weak)) void kiln_pool_start(kiln_pool_t* p) {
  if (__atomic_load_n(&p->state, __ATOMIC_ACQUIRE) == 2) return;
  static int32_t atfork = 0;   /* per unit: harmless if several register (each resets the same pool) */
  if (!__atomic_exchange_n(&atfork, 1, __ATOMIC_ACQ_REL)) pthread_atfork(0, 0, kiln_pool_forked);
  int64_t threads = kiln_pool_asked();
  const char* spin = getenv(KILN_POOL_STR(KILN_POOL_SPIN_US));
  p->spin_ns = (spin && atoi(spin) >= 0 ? atoi(spin) : 100) * (int64_t)1000;
  const char* calm = getenv(KILN_POOL_STR(KILN_POOL_CALM_MS));
  p->calm_ns = calm && atoi(calm) >= 0 ? atoi(calm) * (int64_t)1000000 : KILN_POOL_CALM_NS;
  const char* late = getenv(KILN_POOL_STR(KILN_POOL_LATE_US));
  p->late_ns = late && atoi(late) >= 0 ? atoi(late) * (int64_t)1000 : KILN_POOL_LATE_NS;
  const char* timing = getenv(KILN_POOL_STR(KILN_POOL_TIMES));
  p->timing = timing && (atoi(timing) == 1 || atoi(timing) == 2) ? atoi(timing) : 0;
  const char* serial = getenv(KILN_POOL_STR(KILN_POOL_SERIAL));
  p->serial = serial && atoi(serial) > 0;
  const char* chunks = getenv(KILN_POOL_STR(KILN_POOL_CHUNKS));
  p->chunks = chunks && atoi(chunks) > 0 ? atoi(chunks) : KILN_POOL_CHUNKS;
  int32_t want = threads - 1 < 0 ? 0 : threads - 1 > KILN_POOL_MAX ? KILN_POOL_MAX : (int32_t)(threads - 1);
  p->nworkers = 0;
  p->placed = 0;
  p->team = want + 1;
  for (int k = 0; k < 16; ++k) p->cpus[k] = 0;
  if (syscall(SYS_sched_getaffinity, 0, sizeof p->cpus, p->cpus) < 0) for (int k = 0; k < 16; ++k) p->cpus[k] = 0;
  const int32_t caller = kiln_pool_getcpu();   /* stays free: the workers pinned to the other CPUs */
  __atomic_store_n(&p->sign, 0, __ATOMIC_RELAXED);
  int32_t ncpus = 0;
  for (int k = 0; k < 16; ++k) ncpus += __builtin_popcountl(p->cpus[k]);
  /* (more threads than CPUs: pinned as before, two to a CPU, and none moves) */
  __atomic_store_n(&p->spare, p->team == ncpus ? kiln_pool_cpu(p->cpus, 0, p->team, caller) : -1, __ATOMIC_RELAXED);
  for (int32_t i = 0; i < want; ++i) { p->cpu_of[i] = kiln_pool_cpu(p->cpus, i + 1, p->team, caller); p->tids[i] = 0; }
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  for (int32_t i = 0; i < want; ++i) {
    if (pthread_create(&p->threads[i], &attr, kiln_pool_worker, p) != 0) break;   /* fewer workers */
    p->nworkers = i + 1;
  }
  pthread_attr_destroy(&attr);
  __atomic_store_n(&p->state, 2, __ATOMIC_RELEASE);
}

/* The model's entry: take the pool for this inference (or run loops inline if another thread has it). */
__attribute__((weak)) void kiln_pool_enter(void) {
  if (kiln_pool_depth++ > 0 || kiln_pool_inline) return;
  kiln_pool_t* p = &kiln_pool;
  int32_t free_ = 0;
  if (!__atomic_compare_exchange_n(&p->owner, &free_, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) return;
  kiln_pool_held = 1;
  if (__atomic_load_n(&p->state, __ATOMIC_ACQUIRE) != 2) return;   /* started at the first parallel loop */
  __atomic_store_n(&p->active, 1, __ATOMIC_SEQ_CST);
  kiln_pool_settle(p);
  if (__atomic_load_n(&p->sleepers, __ATOMIC_SEQ_CST) > 0   /* spinning by the first loop (unless contended) */
      && !kiln_pool_calm(p, kiln_pool_now())) kiln_pool_wake_all(p);
}
__attribute__((weak)) void kiln_pool_leave(void) {
  if (--kiln_pool_depth > 0 || !kiln_pool_held) return;
  kiln_pool_t* p = &kiln_pool;
  __atomic_store_n(&p->active, 0, __ATOMIC_SEQ_CST);
  kiln_pool_held = 0;
  __atomic_store_n(&p->owner, 0, __ATOMIC_RELEASE);
}
/* Around a kernel that forks OpenMP's team: the pool's workers sleep meanwhile (not spin
   against that team's threads for the cores), and are woken after it (unless contended). */
__attribute__((weak)) void kiln_pool_park(void) {
  if (kiln_pool_held) __atomic_store_n(&kiln_pool.parked, 1, __ATOMIC_SEQ_CST);
}
__attribute__((weak)) void kiln_pool_unpark(void) {
  if (!kiln_pool_held) return;
  kiln_pool_t* p = &kiln_pool;
  __atomic_store_n(&p->parked, 0, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&p->sleepers, __ATOMIC_SEQ_CST) > 0 && !kiln_pool_calm(p, kiln_pool_now())) kiln_pool_wake_all(p);
}

/* Runs fn(ctx, a, b) over [lo, hi) cut in chunks, on the workers and this thread. */
__attribute__((weak)) void kiln_pool_for(kiln_pool_fn fn, void* ctx, int64_t lo, int64_t hi) {
  int64_t n = hi - lo;
  if (n <= 0) return;
  if (n == 1 || kiln_pool_inline) { fn(ctx, lo, hi); return; }
  int32_t alone = kiln_pool_depth == 0;   /* a kernel called by itself: hold the pool for this loop */
  if (alone) kiln_pool_enter();
  kiln_pool_t* p = &kiln_pool;
  if (kiln_pool_held && __atomic_load_n(&p->state, __ATOMIC_ACQUIRE) != 2) {
    kiln_pool_start(p);
    __atomic_store_n(&p->active, 1, __ATOMIC_SEQ_CST);
  }
  if (kiln_pool_held && p->nworkers) kiln_pool_settle(p);
  /* contended: this thread alone (a worker the scheduler keeps waiting would hold its chunks) */
  if (!kiln_pool_held || p->nworkers == 0 || kiln_pool_calm(p, kiln_pool_now())) {
    if (kiln_pool_held && p->nworkers) p->alone += 1;
    kiln_pool_inline = 1; fn(ctx, lo, hi); kiln_pool_inline = 0;
    if (alone) kiln_pool_leave();
    return;
  }
  int64_t most = p->chunks * (p->nworkers + 1);
  uint64_t m = (uint64_t)(n < most ? n : most);
  if (m > 0xFFFF) m = 0xFFFF;
  if (p->serial) {
    kiln_pool_inline = 1;
    for (uint64_t k = 0; k < m; ++k) fn(ctx, lo + kiln_pool_chunk(n, m, k), lo + kiln_pool_chunk(n, m, k + 1));
    kiln_pool_inline = 0;
    if (alone) kiln_pool_leave();
    return;
  }
  p->forks += 1;
  __atomic_store_n(&p->fn, fn, __ATOMIC_RELAXED);
  __atomic_store_n(&p->ctx, ctx, __ATOMIC_RELAXED);
  __atomic_store_n(&p->lo, lo, __ATOMIC_RELAXED);
  __atomic_store_n(&p->n, n, __ATOMIC_RELAXED);
  __atomic_store_n(&p->done, 0u, __ATOMIC_RELAXED);
  p->gen += 1;
  uint64_t w = ((uint64_t)p->gen << 32) | (m << 16);
  __atomic_store_n(&p->word, w, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&p->sleepers, __ATOMIC_SEQ_CST) > 0) { kiln_pool_wake_all(p); p->loop_wakes += 1; }
  const int64_t f0 = p->timing ? kiln_pool_clock(p) : 0;
  kiln_pool_inline = 1;
  if (kiln_pool_run(p, w) == (int64_t)m) p->solo += 1;
  kiln_pool_inline = 0;
  const int64_t f1 = f0 ? kiln_pool_clock(p) : 0;
  int64_t t0 = 0, last = 0;
  for (uint32_t k = 1, d; (d = __atomic_load_n(&p->done, __ATOMIC_ACQUIRE)) < (uint32_t)m; ++k) {
    kiln_pool_pause();
    if (k % 64 != 0) continue;
    int64_t t = kiln_pool_now();
    if (!t0) t0 = last = t;
    if (t - last > KILN_POOL_GAP_NS && !kiln_pool_place(p, kiln_pool_getcpu())) {   /* (not a worker's turn) */
      kiln_pool_contended(p, t, 0); p->by_join += 1;
    }
    last = t;
    if (t - t0 < (kiln_pool_calm(p, t) ? KILN_POOL_JOIN_BUSY_NS : KILN_POOL_JOIN_NS))
      continue;   /* (no sched_yield: on a busy machine it gives a whole time slice away) */
    /* sleep until a chunk ends (the worker finishing it may share this core, or be preempted) */
    __atomic_store_n(&p->joining, 1, __ATOMIC_SEQ_CST);
    if ((d = __atomic_load_n(&p->done, __ATOMIC_SEQ_CST)) < (uint32_t)m) kiln_pool_sleep(&p->done, d);
    __atomic_store_n(&p->joining, 0, __ATOMIC_SEQ_CST);
  }
  if (f0) {
    const int64_t f2 = kiln_pool_clock(p);
    p->times[0].fork_ns += (uint64_t)(f2 - f0); p->times[0].join_ns += (uint64_t)(f2 - f1);
  }
  if (alone) kiln_pool_leave();
}
/* The threads a parallel loop forked now would run on (kiln_par_threads, for a kernel that plans
   its split by them): 1 inside a chunk, while another thread holds the pool, or while the pool
   is contended (its loops run on the calling thread alone: a kernel that split its work for two
   threads then runs both shares in turn, the recurrent kernel's batch rows at twice one thread's
   time); else the workers and this thread (those the pool will have, before it starts). */
__attribute__((weak)) int32_t kiln_pool_threads(void) {
  kiln_pool_t* p = &kiln_pool;
  if (kiln_pool_inline || (kiln_pool_depth > 0 && !kiln_pool_held)) return 1;
  if (__atomic_load_n(&p->state, __ATOMIC_ACQUIRE) == 2)
    return p->nworkers == 0 || kiln_pool_calm(p, kiln_pool_now()) ? 1 : p->nworkers + 1;
  const int64_t threads = kiln_pool_asked();
  return threads < 1 ? 1 : threads > KILN_POOL_MAX + 1 ? KILN_POOL_MAX + 1 : (int32_t)threads;
}
#pragma GCC visibility pop
#endif
