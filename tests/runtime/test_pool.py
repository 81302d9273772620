"""kiln's thread pool (kiln/codegen/c_src/kiln_pool.h, KILN_THREADS_IMPL=pool): every
iteration of a parallel loop runs exactly once whatever the chunking and the thread count,
loops inside a chunk and a second thread's loops run inline, the workers survive many tiny
loops, an unload joins them, and generated models give the reference's numbers run from
several Python threads at once."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from kiln.codegen.build import compile_c
from kiln.codegen.c import PRELUDE
from kiln.codegen.csource import c_source
from kiln.targets.target import Target

HARNESS = r"""
#include <sched.h>
typedef struct { int32_t* hits; int64_t n; int32_t nested; } job_t;
static void mark(void* c_, int64_t lo, int64_t hi) {
  job_t* c = (job_t*)c_;
  for (int64_t i = lo; i < hi; ++i) __atomic_fetch_add(&c->hits[i], 1, __ATOMIC_RELAXED);
  if (c->nested) {   /* a loop inside a chunk: runs inline on this thread */
    job_t inner = { c->hits + c->n, c->n, 0 };
    kiln_pool_for(mark, &inner, lo, hi);
  }
}
/* `loops` parallel loops over [0, n) (nested: each chunk runs one more over its range),
   inside one "inference" (entered) or each loop by itself; hits counts each index */
int32_t pool_loops(int32_t* hits, int64_t n, int64_t loops, int32_t nested, int32_t entered) {
  job_t c = { hits, n, nested };
  if (entered) kiln_pool_enter();
  for (int64_t r = 0; r < loops; ++r) kiln_pool_for(mark, &c, 0, n);
  if (entered) kiln_pool_leave();
  return 0;
}
/* where each of the m chunks of a loop of n iterations starts (starts[m]: its end) */
int32_t pool_chunk_starts(int64_t n, int64_t m, int64_t* starts) {
  for (int64_t k = 0; k <= m; ++k) starts[k] = kiln_pool_chunk(n, m, k);
  return 0;
}
/* 8 chunks of 2 ms each (sleeping, so a worker gets a core even on a busy machine):
   how many distinct threads ran them */
static pthread_t ran[8];
static void slow(void* c_, int64_t lo, int64_t hi) {
  for (int64_t i = lo; i < hi; ++i) { ran[i] = pthread_self(); struct timespec t = {0, 2000000}; nanosleep(&t, 0); }
}
int32_t pool_distinct(void) {
  kiln_pool_enter();
  kiln_pool_for(slow, 0, 0, 8);
  kiln_pool_leave();
  int32_t distinct = 0;
  for (int i = 0; i < 8; ++i) {
    int seen = 0;
    for (int j = 0; j < i; ++j) seen |= pthread_equal(ran[i], ran[j]);
    distinct += !seen;
  }
  return distinct;
}
/* the pool made again with `threads` threads (its workers joined first) */
int32_t pool_threads(int32_t threads) {
  kiln_pool_stop();
#ifdef _OPENMP
  omp_set_num_threads(threads);
#endif
  return 0;
}
int32_t pool_workers(void) { return kiln_pool.nworkers; }
/* KILN_POOL_STATS's counts: workers asleep inside an inference; loops forked */
int64_t pool_naps(void) { return (int64_t)kiln_pool.naps; }
int64_t pool_forks(void) { return (int64_t)kiln_pool.forks; }
/* the CPU worker `me` of a pool of `team` threads is pinned to under the mask `cpus`, the caller
   on CPU `caller` (-1: none) */
int32_t pool_cpu(const unsigned long* cpus, int32_t me, int32_t team, int32_t caller) {
  return kiln_pool_cpu(cpus, me, team, caller);
}
/* a second thread holding the pool: the caller's loops then run inline */
static void* hold(void* arg) { kiln_pool_enter(); __atomic_store_n((int32_t*)arg, 1, __ATOMIC_SEQ_CST);
  while (__atomic_load_n((int32_t*)arg, __ATOMIC_SEQ_CST) == 1) sched_yield(); kiln_pool_leave(); return 0; }
int32_t pool_busy(int32_t* hits, int64_t n, int64_t* workers_used) {
  int32_t flag = 0; pthread_t t;
  pthread_create(&t, 0, hold, &flag);
  while (__atomic_load_n(&flag, __ATOMIC_SEQ_CST) == 0) sched_yield();
  job_t c = { hits, n, 0 };
  kiln_pool_enter();
  *workers_used = kiln_pool_held;
  kiln_pool_for(mark, &c, 0, n);
  kiln_pool_leave();
  __atomic_store_n(&flag, 2, __ATOMIC_SEQ_CST);
  pthread_join(t, 0);
  return 0;
}
/* contended for a second (as a descheduled worker marks it): how many distinct threads ran 8 slow chunks */
int32_t pool_contended_distinct(void) {
  __atomic_store_n(&kiln_pool.calm_after, kiln_pool_now() + 1000000000, __ATOMIC_RELAXED);
  int32_t d = pool_distinct();
  __atomic_store_n(&kiln_pool.calm_after, 0, __ATOMIC_RELAXED);
  return d;
}
/* the calm (ns) that each of `n` contentions gives, each 1 ms after the last one's calm ended,
   stalls or the other signs, from a pool not contended for long, with a calm of 10 ms */
int32_t pool_calms(int32_t stall, int32_t n, int64_t* out) {
  kiln_pool_t* p = &kiln_pool;
  const int64_t after = p->calm_after, cur = p->calm_cur, ns = p->calm_ns;
  p->calm_ns = 10000000; p->calm_after = 0; p->calm_cur = 0;
  int64_t t = 5000000000LL;
  for (int32_t k = 0; k < n; ++k) {
    kiln_pool_contended(p, t, stall);
    out[k] = p->calm_after - t;
    t = p->calm_after + 1000000;
  }
  p->calm_after = after; p->calm_cur = cur; p->calm_ns = ns;
  return 0;
}
/* one loop of 8 x 2 ms chunks after the workers went to sleep: whether a worker was asleep at
   the fork, and how many distinct threads ran the chunks */
int32_t pool_after_sleep(int32_t* asleep) {
  kiln_pool_enter();
  kiln_pool_for(slow, 0, 0, 2);   /* workers made */
  struct timespec t = {0, 30000000};
  nanosleep(&t, 0);               /* past their spin (KILN_POOL_SPIN_US) */
  *asleep = __atomic_load_n(&kiln_pool.sleepers, __ATOMIC_SEQ_CST) > 0;
  kiln_pool_leave();
  return pool_distinct();
}
/* chunks that sleep 5 ms on a worker (off its core: as if descheduled) and take nothing on the
   calling thread (which waits up to 50 ms for a worker to claim one): whether a worker ran
   one, the stalls counted, whether the pool is contended after it */
static pthread_t caller;
static int32_t claimed;
static void lopsided(void* c_, int64_t lo, int64_t hi) {
  (void)c_; (void)lo; (void)hi;
  if (!pthread_equal(pthread_self(), caller)) {
    __atomic_store_n(&claimed, 1, __ATOMIC_SEQ_CST);
    struct timespec t = {0, 5000000};
    nanosleep(&t, 0);
    return;
  }
  const int64_t t0 = kiln_pool_now();
  while (!__atomic_load_n(&claimed, __ATOMIC_SEQ_CST) && kiln_pool_now() - t0 < 50000000) sched_yield();
}
static void noop(void* c_, int64_t lo, int64_t hi) { (void)c_; (void)lo; (void)hi; }
int32_t pool_stall(int64_t* stalls, int32_t* calm_after) {
  caller = pthread_self();
  __atomic_store_n(&claimed, 0, __ATOMIC_SEQ_CST);
  kiln_pool_enter();
  kiln_pool_for(noop, 0, 0, 2);   /* workers made */
  const int64_t ns = kiln_pool.calm_ns, before = (int64_t)kiln_pool.by_stall;
  kiln_pool.calm_ns = 10000000; kiln_pool.calm_after = 0; kiln_pool.calm_cur = 0;
  kiln_pool_for(lopsided, 0, 0, 8);
  const int64_t t0 = kiln_pool_now();   /* (the worker counts it after its chunk: not before the join ends) */
  while ((int64_t)__atomic_load_n(&kiln_pool.by_stall, __ATOMIC_SEQ_CST) == before && kiln_pool_now() - t0 < 100000000)
    sched_yield();
  *stalls = (int64_t)kiln_pool.by_stall - before;
  *calm_after = kiln_pool_calm(&kiln_pool, kiln_pool_now());
  kiln_pool.calm_ns = ns; kiln_pool.calm_after = 0; kiln_pool.calm_cur = 0;
  kiln_pool_leave();
  return __atomic_load_n(&claimed, __ATOMIC_SEQ_CST);
}
/* `loops` loops of 8 busy chunks of ~20 us (the calm at 10 ms, as by default): chunks run by the
   caller (out[0]) and by workers (out[1]), the CPU the last worker's chunk ran on (out[2]) and
   the caller's (out[3]) */
static int64_t split_counts[2];
static int32_t split_cpu[2];
static void busy(void* c_, int64_t lo, int64_t hi) {
  (void)c_;
  const int32_t mine = pthread_equal(pthread_self(), caller) ? 0 : 1;
  for (int64_t i = lo; i < hi; ++i) { const int64_t t0 = kiln_pool_now(); while (kiln_pool_now() - t0 < 20000) {} }
  __atomic_fetch_add(&split_counts[mine], hi - lo, __ATOMIC_RELAXED);
  __atomic_store_n(&split_cpu[mine], kiln_pool_getcpu(), __ATOMIC_RELAXED);
}
int32_t pool_split(int64_t loops, int64_t* out) {
  caller = pthread_self();
  split_counts[0] = split_counts[1] = 0; split_cpu[0] = split_cpu[1] = -1;
  const int64_t ns = kiln_pool.calm_ns;
  kiln_pool.calm_ns = 10000000;
  kiln_pool_enter();
  for (int64_t r = 0; r < loops; ++r) kiln_pool_for(busy, 0, 0, 8);
  kiln_pool_leave();
  kiln_pool.calm_ns = ns; kiln_pool.calm_after = 0; kiln_pool.calm_cur = 0;
  out[0] = split_counts[0]; out[1] = split_counts[1]; out[2] = split_cpu[1]; out[3] = kiln_pool_getcpu();
  return 0;
}
/* workers asleep (out of nworkers) `ms` after parking inside an inference, and `ms` after unparking */
int32_t pool_parked(int32_t ms, int32_t* asleep_parked, int32_t* asleep_after) {
  job_t c = { 0, 0, 0 };
  kiln_pool_enter();
  kiln_pool_for(slow, 0, 0, 2);   /* workers made and running */
  kiln_pool_park();
  struct timespec t = {0, ms * 1000000L};
  nanosleep(&t, 0);
  *asleep_parked = __atomic_load_n(&kiln_pool.sleepers, __ATOMIC_SEQ_CST);
  kiln_pool_unpark();
  *asleep_after = __atomic_load_n(&kiln_pool.sleepers, __ATOMIC_SEQ_CST);   /* (woken: not yet counted off) */
  kiln_pool_leave();
  (void)c;
  return 0;
}
/* kiln_pool_threads (kiln_par_threads on the pool: what a kernel plans its split by): out[0]
   before the pool starts, out[1] in an inference, out[2] inside a chunk, out[3] while contended,
   out[4] while another thread holds the pool */
static int32_t in_chunk;
static void threads_in_chunk(void* c_, int64_t lo, int64_t hi) {
  (void)c_; (void)lo; (void)hi;
  __atomic_store_n(&in_chunk, kiln_pool_threads(), __ATOMIC_RELAXED);
}
int32_t pool_threads_seen(int32_t* out) {
  out[0] = kiln_pool_threads();
  kiln_pool_enter();
  kiln_pool_for(noop, 0, 0, 2);   /* workers made */
  out[1] = kiln_pool_threads();
  kiln_pool_for(threads_in_chunk, 0, 0, 2);
  out[2] = __atomic_load_n(&in_chunk, __ATOMIC_RELAXED);
  __atomic_store_n(&kiln_pool.calm_after, kiln_pool_now() + 1000000000, __ATOMIC_RELAXED);
  out[3] = kiln_pool_threads();
  __atomic_store_n(&kiln_pool.calm_after, 0, __ATOMIC_RELAXED);
  kiln_pool_leave();
  int32_t flag = 0; pthread_t t;
  pthread_create(&t, 0, hold, &flag);
  while (__atomic_load_n(&flag, __ATOMIC_SEQ_CST) == 0) sched_yield();
  kiln_pool_enter();
  out[4] = kiln_pool_threads();
  kiln_pool_leave();
  __atomic_store_n(&flag, 2, __ATOMIC_SEQ_CST);
  pthread_join(t, 0);
  return 0;
}
"""

PAR = r"""
typedef struct { int32_t* hits; } par_t;
static void par_mark(void* c_, int64_t lo, int64_t hi) {
  for (int64_t i = lo; i < hi; ++i) __atomic_fetch_add(&((par_t*)c_)->hits[i], 1, __ATOMIC_RELAXED);
}
int32_t par_loops(int32_t* hits, int64_t lo, int64_t hi, int32_t par, int64_t loops) {
  par_t c = { hits };
  for (int64_t r = 0; r < loops; ++r) kiln_par_for(par_mark, &c, lo, hi, par);
  return 0;
}
"""


@pytest.fixture(scope="module")
def lib():
    # never contended unless a test says so (a loaded machine would run the loops inline)
    os.environ["KILN_POOL_CALM_MS"] = "0"
    path = compile_c(PRELUDE + "\n" + c_source("kiln_pool.h") + HARNESS, Target.host())
    lib = ctypes.CDLL(str(path))
    lib.pool_loops.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int32, ctypes.c_int32]
    lib.pool_busy.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    lib.pool_parked.argtypes = [ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p]
    lib.pool_cpu.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32]
    lib.pool_chunk_starts.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    yield lib
    lib.pool_threads(2)
    del os.environ["KILN_POOL_CALM_MS"]


def _loops(lib, n, loops=1, nested=False, entered=True):
    hits = np.zeros(2 * max(n, 1), np.int32)
    lib.pool_loops(hits.ctypes.data, n, loops, int(nested), int(entered))
    return hits


@pytest.mark.parametrize("threads", [1, 2, 3, 5])
@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 7, 64, 1000, 70001])
def test_every_iteration_runs_once(lib, threads, n):
    lib.pool_threads(threads)
    hits = _loops(lib, n, loops=3)
    assert (hits[:n] == 3).all() and (hits[n:] == 0).all()
    assert lib.pool_workers() == (threads - 1 if n > 1 else lib.pool_workers())


@pytest.mark.parametrize("n", [1, 2, 7, 8, 14, 28, 35, 105, 1000])
@pytest.mark.parametrize("m", [1, 2, 3, 8])
def test_larger_chunks_come_first(lib, n, m):
    """A loop's chunks cover it in order, each one iteration larger than another at most, the
    larger first: threads claiming them as they come then finish together (14 rows in 8 chunks
    alternating 1 and 2 left one thread a row behind the other at the join)."""
    if m > n:
        return
    starts = np.zeros(m + 1, np.int64)
    lib.pool_chunk_starts(n, m, starts.ctypes.data)
    sizes = np.diff(starts)
    assert starts[0] == 0 and starts[-1] == n
    assert (sizes >= n // m).all() and (sizes <= -(-n // m)).all()
    assert (np.diff(sizes) <= 0).all(), sizes


@pytest.mark.parametrize("n", [1, 2, 5, 7, 8, 14, 33, 105])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_python_cuts_loops_as_the_pool_does(lib, n, threads):
    """kiln.runtime.threads.pool_chunks (what plans model: kiln.lower.winograd.balanced_osplit)
    gives the chunks kiln_pool_for cuts: POOL_CHUNKS per thread at most, by kiln_pool_chunk."""
    from kiln.codegen.csource import c_source
    from kiln.runtime.threads import POOL_CHUNKS, pool_chunks, pool_span
    assert f"#define KILN_POOL_CHUNKS {POOL_CHUNKS} " in c_source("kiln_pool.h")
    m = min(n, POOL_CHUNKS * threads)
    starts = np.zeros(m + 1, np.int64)
    lib.pool_chunk_starts(n, m, starts.ctypes.data)
    assert pool_chunks(n, threads) == list(zip(starts[:-1].tolist(), starts[1:].tolist()))
    assert pool_span([1.0] * m, threads) == -(-m // threads)


@pytest.mark.parametrize("chunks", ["1", "16"])
def test_chunks_per_thread_setting(lib, chunks):
    """KILN_POOL_CHUNKS (chunks per thread, read as the pool starts): every iteration once."""
    os.environ["KILN_POOL_CHUNKS"] = chunks
    try:
        lib.pool_threads(3)
        for n in (2, 5, 47, 1000):
            hits = _loops(lib, n, loops=3)
            assert (hits[:n] == 3).all() and (hits[n:] == 0).all()
    finally:
        del os.environ["KILN_POOL_CHUNKS"]
        lib.pool_threads(2)


@pytest.mark.parametrize("entered", [True, False])
def test_many_tiny_loops(lib, entered):
    """20000 loops of 2-5 iterations: no chunk lost or run twice, no hang at a join."""
    lib.pool_threads(3)
    for n in (2, 3, 5):
        hits = _loops(lib, n, loops=20000 if entered else 2000, entered=entered)
        assert (hits[:n] == (20000 if entered else 2000)).all()


def test_the_workers_take_chunks(lib):
    """A worker joins a loop of 8 x 2 ms chunks (on a loaded machine it may not be scheduled
    in time, and the caller does them all: tried a few times)."""
    lib.pool_threads(3)
    assert max(lib.pool_distinct() for _ in range(10)) >= 2
    lib.pool_threads(1)
    assert lib.pool_distinct() == 1


def test_a_contended_pool_runs_loops_on_the_calling_thread(lib):
    """Contended (a worker found itself descheduled: a busy machine, or another runtime's
    threads on the cores), the caller runs every chunk: a worker the scheduler keeps waiting
    would hold the chunks it claimed."""
    lib.pool_threads(3)
    assert lib.pool_contended_distinct() == 1
    assert max(lib.pool_distinct() for _ in range(10)) >= 2   # and the calm ends


def _times(lib) -> np.ndarray:
    """kiln_pool_times: per thread (caller first) ns in chunks, chunks, ns in forks, ns at joins."""
    out = (ctypes.c_uint64 * 64)()
    lib.kiln_pool_times.restype = ctypes.c_int32
    lib.kiln_pool_times(out, ctypes.c_int32(64))
    return np.array(out, dtype=np.int64).reshape(-1, 4)


@pytest.mark.parametrize("clock", ["1", "2"])
def test_pool_times_count_each_threads_chunks(lib, clock):
    """KILN_POOL_TIMES=1 (wall clock) or 2 (each thread's CPU clock; benchmarks/pool_probe.py reads
    them): each thread's chunks and its time in them, the caller's time in its forks and, of
    that, after its last chunk until the join; nothing counted without the setting."""
    os.environ["KILN_POOL_TIMES"] = clock
    try:
        lib.pool_threads(2)
        before = _times(lib)
        _loops(lib, 64, loops=50)   # 8 chunks a loop
        got = _times(lib) - before
    finally:
        del os.environ["KILN_POOL_TIMES"]
    assert got[:, 1].sum() == 50 * 8 and not got[2:].any()
    assert got[0, 2] >= got[0, 0] > 0 and got[0, 2] >= got[0, 3] > 0
    lib.pool_threads(2)
    before = _times(lib)
    _loops(lib, 64, loops=50)
    assert not (_times(lib) - before).any()


def test_the_serial_setting_runs_every_chunk_on_the_caller(lib):
    """KILN_POOL_SERIAL=1 (what cutting a loop costs, apart from the threads): the chunks a loop is
    cut into for the team, each once, in order, on the calling thread."""
    os.environ["KILN_POOL_SERIAL"] = "1"
    try:
        lib.pool_threads(3)
        assert lib.pool_distinct() == 1
        assert (_loops(lib, 57, loops=20)[:57] == 20).all()
    finally:
        del os.environ["KILN_POOL_SERIAL"]
        lib.pool_threads(3)
    assert max(lib.pool_distinct() for _ in range(10)) >= 2


def test_kernels_see_the_threads_a_fork_would_run_on(lib):
    """kiln_pool_threads (a kernel's kiln_par_threads, which plans its split by it: the recurrent
    kernel's batch rows): the team, but 1 inside a chunk, while contended and while another
    thread holds the pool, where a loop runs on the calling thread alone: a split planned for
    the team would then run its shares in turn (LSTM batch rows: twice one thread's time)."""
    lib.pool_threads(3)
    lib.pool_threads_seen.argtypes = [ctypes.c_void_p]
    out = np.zeros(5, np.int32)
    lib.pool_threads_seen(out.ctypes.data)
    assert out.tolist() == [3, 3, 1, 1, 1]


def test_only_a_stall_lengthens_the_calm(lib):
    """A join that waited on a worker the scheduler kept from its chunk doubles the calm while
    it recurs (to 1 s); the signs that cost the caller nothing (a spinning worker descheduled,
    a late wake-up: ONNX Runtime's threads spinning for tens of ms after its run) give 10 ms
    each time, so the pool has its worker back 10 ms after such a peer's spin ends."""
    lib.pool_calms.argtypes = [ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p]
    out = np.zeros(9, np.int64)
    lib.pool_calms(1, 9, out.ctypes.data)
    assert (out // 1000000).tolist() == [10, 20, 40, 80, 160, 320, 640, 1000, 1000]
    lib.pool_calms(0, 9, out.ctypes.data)
    assert (out // 1000000).tolist() == [10] * 9


def test_a_late_worker_leaves_the_loop_it_was_woken_for(lib):
    """A worker that runs later than KILN_POOL_LATE_US after its wake-up (the cores are busy)
    claims no chunk of the loop that woke it: one the scheduler keeps waiting would hold them."""
    os.environ.update(KILN_POOL_LATE_US="0", KILN_POOL_SPIN_US="0")   # every wake-up is late
    try:
        lib.pool_threads(2)
        lib.pool_after_sleep.argtypes = [ctypes.c_void_p]
        asleep, seen = np.zeros(1, np.int32), 0
        for _ in range(5):
            distinct = lib.pool_after_sleep(asleep.ctypes.data)
            if asleep[0]:
                seen += 1
                assert distinct == 1
        assert seen
    finally:
        del os.environ["KILN_POOL_LATE_US"], os.environ["KILN_POOL_SPIN_US"]
        lib.pool_threads(2)
    # on time, the woken worker does take chunks (tried a few times: a loaded machine may be late)
    os.environ["KILN_POOL_SPIN_US"] = "0"
    try:
        lib.pool_threads(2)
        asleep = np.zeros(1, np.int32)
        assert max(lib.pool_after_sleep(asleep.ctypes.data) for _ in range(10)) == 2
    finally:
        del os.environ["KILN_POOL_SPIN_US"]
        lib.pool_threads(2)


def test_a_stalled_worker_makes_the_pool_contended(lib):
    """A worker off its core for 5 ms while it held a chunk (here asleep in it; on a busy
    machine descheduled) is a stall: counted, and the next loops run on the caller alone."""
    lib.pool_threads(2)
    lib.pool_stall.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    stalls, calm = np.zeros(1, np.int64), np.zeros(1, np.int32)
    for _ in range(10):   # (a loaded machine may not run the worker within 50 ms)
        if lib.pool_stall(stalls.ctypes.data, calm.ctypes.data):
            break
    assert stalls[0] == 1 and calm[0] == 1


def _counts(lib) -> dict:
    from kiln.runtime.threads import pool_counts
    return pool_counts(lib)


def test_pool_counts_are_read_from_python(lib):
    """kiln.runtime.threads.pool_counts: KILN_POOL_STATS's counts of a loaded library's pool
    (None for one without kiln's pool)."""
    from kiln.runtime.threads import POOL_COUNTS, pool_counts
    lib.pool_threads(2)
    before = _counts(lib)
    assert set(before) == set(POOL_COUNTS)
    _loops(lib, 64, loops=5)
    after = _counts(lib)
    assert after["forks"] + after["alone"] == before["forks"] + before["alone"] + 5
    plain = ctypes.CDLL(str(compile_c(PRELUDE + "\n" + c_source("kiln_par.h") + PAR, Target.host())))
    assert pool_counts(plain) is None


def test_parked_workers_sleep(lib):
    """Around a kernel that forks OpenMP's team the pool's workers sleep (not spin against
    that team for the cores); unparked, they are woken."""
    lib.pool_threads(3)
    lib.pool_naps.restype = lib.pool_forks.restype = ctypes.c_int64
    parked, after = np.zeros(1, np.int32), np.zeros(1, np.int32)
    naps = lib.pool_naps()
    for _ in range(20):   # (a busy machine may not run a worker within the wait)
        lib.pool_parked(20, parked.ctypes.data, after.ctypes.data)
        if parked[0] == 2:
            break
    assert parked[0] == 2
    assert lib.pool_naps() >= naps + 2   # counted as naps inside an inference (KILN_POOL_STATS)


@pytest.mark.parametrize("pool", [True, False])
@pytest.mark.parametrize("lo,hi", [(0, 0), (0, 1), (3, 5), (0, 7), (5, 1000)])
def test_kiln_par_for_runs_every_iteration_once(pool, lo, hi):
    """A hand-written kernel's kiln_par_for (kiln/codegen/c_src/kiln_par.h) on kiln's pool or
    on OpenMP's team, in parallel or not."""
    head = c_source("kiln_pool.h") if pool else ""
    par = ctypes.CDLL(str(compile_c(PRELUDE + "\n" + head + c_source("kiln_par.h") + PAR, Target.host())))
    par.par_loops.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int32, ctypes.c_int64]
    for flag in (1, 0):
        hits = np.zeros(1000, np.int32)
        par.par_loops(hits.ctypes.data, lo, hi, flag, 7)
        assert (hits[lo:hi] == 7).all() and hits[:lo].sum() == 0 and hits[hi:].sum() == 0


def test_workers_are_pinned_only_where_the_pool_fills_the_mask(lib):
    """The workers go to the mask's CPUs in order, the caller's left out (it stays free: 0 asks
    for it), when the pool's threads fill the mask; a pool smaller than the mask (two models run
    at once, OMP_NUM_THREADS at half the CPUs: each library's pool would pin its workers to the
    same first CPUs) is left to the scheduler."""
    def cpu(cpus, me, team, caller=None):
        mask = (ctypes.c_ulong * 16)()
        for c in cpus:
            mask[c // 64] |= 1 << (c % 64)
        return lib.pool_cpu(mask, me, team, min(cpus) if caller is None else caller)
    assert [cpu([0, 1], me, 2) for me in (0, 1, 2)] == [0, 1, 0]
    assert [cpu([0, 1], me, 2, caller=1) for me in (0, 1, 2)] == [1, 0, 1]   # never the caller's CPU
    assert [cpu(range(8), me, 8) for me in range(1, 8)] == list(range(1, 8))
    assert [cpu(range(8), me, 8, caller=5) for me in range(8)] == [5, 0, 1, 2, 3, 4, 6, 7]
    assert cpu([2, 5], 1, 2, caller=9) == 5                              # a caller outside the mask: the first is left free
    assert cpu([0, 1], 1, 2, caller=-1) == 1                             # (its CPU unknown: the same)
    assert [cpu(range(8), me, 4) for me in range(1, 4)] == [-1] * 3     # half the CPUs: not pinned
    assert cpu([2, 5], 1, 2) == 5 and cpu([3, 70], 1, 2) == 70        # the mask's own CPUs, past 64 too
    assert cpu([3], 1, 2) == -1                                          # one CPU: nothing to choose


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) != 2,
                    reason="needs a 2-CPU mask (a pool of 2 fills it, so its worker is pinned)")
def test_a_caller_on_the_workers_cpu_moves_the_worker(lib):
    """The calling thread moved (here pinned) to the CPU its worker is pinned to: the worker
    moves to the CPU the caller left, the loops still split between the two threads on two CPUs,
    and the worker's turns spent waiting for the caller are not read as contention. Before, the
    worker stayed, read its turns as contention, and the loops ran on the caller alone (tiny_cnn
    batch 8: 88% of them). Counted with the pool's counters; busy chunks of ~20 us, with the calm
    at 10 ms; best of a few tries (a loaded machine takes a core from the worker at times)."""
    from kiln.runtime.threads import pool_counts
    full = os.sched_getaffinity(0)
    lib.pool_threads(2)
    lib.pool_split.argtypes = [ctypes.c_int64, ctypes.c_void_p]
    out = np.zeros(4, np.int64)
    for _ in range(20):                                # workers made: where the worker runs
        lib.pool_split(50, out.ctypes.data)
        if out[2] >= 0:
            break
    assert out[2] >= 0 and out[2] != out[3], out       # pinned, not on the caller's CPU
    best = None
    try:
        for _ in range(8):
            worker_cpu = int(out[2])
            os.sched_setaffinity(0, {worker_cpu})      # the caller onto the worker's CPU
            c0 = pool_counts(lib)
            lib.pool_split(400, out.ctypes.data)
            c1 = pool_counts(lib)
            d = {k: c1[k] - c0[k] for k in ("forks", "alone", "moved", "by_spin", "by_wake", "shared")}
            share = out[1] / (out[0] + out[1])
            if best is None or share > best[0]:
                best = (share, d, int(out[2]), int(out[3]))
            if share > 0.3 and d["alone"] < 0.2 * d["forks"]:
                break
            os.sched_setaffinity(0, full)
    finally:
        os.sched_setaffinity(0, full)
    share, d, worker_cpu, caller_cpu = best
    # ~half the chunks ran on the worker (quiet: 0.4-0.5; at load 3, 0.25-0.5; before, 0.02)
    assert share > 0.15, best
    assert d["alone"] < 0.5 * (d["forks"] + d["alone"]), best
    assert d["moved"] >= 1 and worker_cpu != caller_cpu, best


def test_loops_inside_a_chunk_run_inline(lib):
    lib.pool_threads(3)
    hits = _loops(lib, 50, loops=10, nested=True)
    assert (hits == 10).all()


def test_a_second_thread_runs_its_loops_inline_while_the_pool_is_held(lib):
    lib.pool_threads(2)
    hits, held = np.zeros(100, np.int32), np.zeros(1, np.int64)
    lib.pool_busy(hits.ctypes.data, 100, held.ctypes.data)
    assert held[0] == 0 and (hits == 1).all()


def test_python_threads_share_one_pool(lib):
    lib.pool_threads(3)
    errors = []

    def work():
        for _ in range(50):
            hits = _loops(lib, 37, loops=20)
            if not (hits[:37] == 20).all():
                errors.append(hits)
    ts = [threading.Thread(target=work) for _ in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors


UNLOAD = r"""
import ctypes, _ctypes, os, sys
path = sys.argv[1]
for i in range(30):
    lib = ctypes.CDLL(path, mode=os.RTLD_LOCAL)
    lib.pool_loops.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int32, ctypes.c_int32]
    buf = (ctypes.c_int32 * 200)()
    lib.pool_loops(ctypes.addressof(buf), 100, 50, 0, i % 2)
    assert all(buf[k] == 50 for k in range(100)), i
    handle = lib._handle
    del lib
    _ctypes.dlclose(handle)   # the destructor joins the workers before the code goes away
lib = ctypes.CDLL(path)
lib.pool_loops.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int32, ctypes.c_int32]
buf = (ctypes.c_int32 * 200)()
lib.pool_loops(ctypes.addressof(buf), 100, 5, 0, 1)   # workers running when the process forks
pid = os.fork()
if pid == 0:   # a forked child makes its own workers
    buf = (ctypes.c_int32 * 200)()
    lib.pool_loops(ctypes.addressof(buf), 100, 50, 0, 1)
    os._exit(0 if all(buf[k] == 50 for k in range(100)) else 3)
_, status = os.waitpid(pid, 0)
print("ok", status)
"""


def test_unload_and_fork(lib, tmp_path):
    """A library unloaded with its workers started, 30 times, then a fork()ed child: no crash
    or hang (the child makes its workers again)."""
    path = compile_c(PRELUDE + "\n" + c_source("kiln_pool.h") + HARNESS, Target.host())
    out = subprocess.run([sys.executable, "-c", UNLOAD, str(path)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OMP_NUM_THREADS": "3"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ok", "0"]


# -- generated models on the pool ------------------------------------------------------------

def _mlp(seed: int, batch: int = 64, width: int = 96):
    """x[batch, width] -> Relu(x @ W1 + b1) @ W2: GEMMs big enough to run in parallel."""
    import onnx
    from onnx import helper, numpy_helper
    rng = np.random.default_rng(seed)
    w1, w2 = (rng.standard_normal((width, width)).astype(np.float32) / 8 for _ in range(2))
    b1 = rng.standard_normal(width).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y"])]
    io = lambda name: helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [batch, width])  # noqa: E731
    graph = helper.make_graph(nodes, "mlp", [io("x")], [io("y")],
                              [numpy_helper.from_array(a, k) for a, k in ((w1, "w1"), (w2, "w2"), (b1, "b1"))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, (lambda x: np.maximum(x @ w1 + b1, 0) @ w2)


@pytest.fixture
def pool_env(monkeypatch):
    monkeypatch.setenv("KILN_THREADS_IMPL", "pool")


def test_generated_parallel_loops_use_the_pool(pool_env):
    from kiln.compiler import run_stages
    model, _ = _mlp(0)
    src = run_stages(model, "c").source.text
    assert "kiln_pool_for(" in src and "kiln_pool_enter();" in src and "#pragma omp parallel" not in src


@pytest.mark.parametrize("impl, other", [("omp", "pool"), ("pool", "omp")])
def test_the_targets_threads_impl_picks_the_emitted_forks(monkeypatch, impl, other):
    """The Target's threads_impl, not $KILN_THREADS_IMPL at emission, says who runs the
    parallel loops: the code then agrees with the lowering's fork decisions and the cache key."""
    import dataclasses

    from kiln.compiler import run_stages
    from kiln.targets.target import Target
    target = dataclasses.replace(Target.host(), threads_impl=impl)
    monkeypatch.setenv("KILN_THREADS_IMPL", other)   # the environment now says otherwise
    model, _ = _mlp(0, batch=256, width=512)   # GEMMs that fork under OpenMP's sleeping team too
    st = run_stages(model, "c", cpu=target)
    src = st.source.text
    assert st.optimized.target.threads_impl == impl
    if impl == "omp":
        assert "#pragma omp parallel" in src and "kiln_pool_for(" not in src and "kiln_pool_enter" not in src
    else:
        assert "kiln_pool_for(" in src and "kiln_pool_enter();" in src and "#pragma omp parallel" not in src


def test_two_python_threads_run_two_models_at_once(pool_env):
    import kiln
    models = [_mlp(seed) for seed in (1, 2)]
    compiled = [kiln.compile(m) for m, _ in models]
    errors = []

    def work(k):
        rng = np.random.default_rng(k)
        for _ in range(40):
            x = rng.standard_normal((64, 96)).astype(np.float32)
            for (m, ref), c in zip(models, compiled):   # both models from both threads
                y = c(x)
                if not np.allclose(y, ref(x), rtol=1e-4, atol=1e-4):
                    errors.append(k)
    ts = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors


def test_models_freed_and_loaded_in_a_loop(pool_env):
    import gc

    import kiln
    model, ref = _mlp(3)
    x = np.random.default_rng(3).standard_normal((64, 96)).astype(np.float32)
    for _ in range(5):
        c = kiln.compile(model)
        np.testing.assert_allclose(c(x), ref(x), rtol=1e-4, atol=1e-4)
        del c
        gc.collect()


def test_a_failed_check_inside_a_chunk_is_reported(pool_env):
    """A run-time check failing in an outlined loop (an index out of range, seen by one chunk
    of a parallel Gather) reaches the caller as the node's KilnError with the bad value."""
    import onnx
    from onnx import helper, numpy_helper

    import kiln
    from kiln.compiler import run_stages
    data = np.random.default_rng(4).standard_normal((512, 1024)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["d", "i"], ["y"], axis=0)], "g",
        [helper.make_tensor_value_info("i", onnx.TensorProto.INT64, [256])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [256, 1024])], [numpy_helper.from_array(data, "d")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    assert "kiln_fail(kiln_c->kiln_status" in run_stages(model, "c").source.text   # the check is in a chunk
    c = kiln.compile(model)
    idx = (np.arange(256) * 7) % 512
    np.testing.assert_array_equal(c(idx), data[idx])
    idx[200] = 9999
    with pytest.raises(kiln.KilnError, match="9999"):
        c(idx)


def test_only_kernels_forking_openmp_themselves_park_the_pool():
    """A hand-written kernel with its own `omp parallel` is bracketed by kiln_pool_park/unpark
    in a pool module; one whose loops go through kiln_par_for (the module's threads) is not."""
    from kiln.codegen.c import forks_openmp
    from kiln.codegen.csource import c_parallel
    from kiln.loops import stmt as S
    own = S.ExternFunc("k", (), "  #pragma omp parallel for\n  for (int i = 0; i < 4; ++i) f(i);\n  return 0;")
    team = S.ExternFunc("k", (), "  return g();", preamble="static int g(void) { return omp_get_thread_num(); }")
    simd = S.ExternFunc("k", (), "  #pragma omp simd\n  for (int i = 0; i < 4; ++i) f(i);\n  return 0;")
    shared = [S.ExternFunc("k", (), "  return h();", preamble=c_parallel(impl) + "static int h(void) { return 0; }")
              for impl in ("pool", "omp")]
    assert forks_openmp(own) and forks_openmp(team)
    assert not forks_openmp(simd) and not any(forks_openmp(f) for f in shared)


def test_a_winograd_model_forks_no_openmp_team_on_the_pool(pool_env):
    """The Winograd kernel's tasks run on the pool (kiln_par_for), the model's source has no
    OpenMP fork left and no parking around the kernel."""
    from kiln.compiler import run_stages
    from tests.lower.test_winograd import conv_model
    model, *_ = conv_model(2, 32, 32, 20, 20, [1, 1, 1, 1], True, seed=5)
    src = run_stages(model, "c").source.text
    assert "kiln_winograd" in src and "kiln_par_for(" in src
    assert "kiln_pool_park();" not in src
