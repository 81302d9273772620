"""What each thread of kiln's pool does during a corpus model's runs: per run, the wall time, the
calling thread's CPU time, each thread's time on a CPU and waiting for one (schedstat), context
switches, the process's minor page faults, and the pool's counters (kiln.runtime.threads.pool_counts),
in a child process per thread count (a library's pool takes its threads when it loads).

    python benchmarks/pool_probe.py resnet50 batch=1 [--threads 1,2] [--runs 40] [--rounds 1]

Medians per run. "on cpu" sums the threads' CPU time (a spinning worker counts: it is on a CPU);
"rq wait" is time a runnable thread waited for one (a loaded machine, or two threads on one CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _tasks() -> dict[int, tuple[int, int, int, int]]:
    """Each thread of this process: (ns on a CPU, ns waiting for one, voluntary and involuntary switches)."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                run, wait, _ = (int(x) for x in f.read().split())
            with open(f"/proc/self/task/{tid}/status") as f:
                sw = {k: int(v) for k, v in (ln.split(":") for ln in f if "ctxt_switches" in ln)}
        except OSError:
            continue
        out[int(tid)] = (run, wait, sw.get("voluntary_ctxt_switches", 0), sw.get("nonvoluntary_ctxt_switches", 0))
    return out


def _irqs() -> dict[str, int]:
    """The machine's TLB shootdown and function call interrupts so far, all CPUs (/proc/interrupts)."""
    out = {}
    try:
        with open("/proc/interrupts") as f:
            for ln in f:
                parts = ln.split()
                if parts and parts[0] in ("TLB:", "CAL:"):
                    out[parts[0][:3]] = sum(int(x) for x in parts[1:] if x.isdigit())
    except OSError:
        pass
    return out


def _times(lib) -> list[int]:
    """kiln_pool_times's figures (KILN_POOL_TIMES=1|2), or none."""
    import ctypes
    fn = getattr(lib, "kiln_pool_times", None) if lib is not None else None
    if fn is None:
        return []
    out = (ctypes.c_uint64 * 64)()
    fn.restype = ctypes.c_int32
    fn(out, ctypes.c_int32(64))
    return [int(v) for v in out]


def _calls(m, feeds):
    """The module that runs `feeds`, its entry's kernel calls (ctypes function, arguments) and
    the arrays they point into (kept alive by the caller)."""
    import ctypes

    import numpy as np
    values = [np.ascontiguousarray(x) for x in m.ordered(feeds)]
    runner = m.program.runner_for(values)
    outs = [np.empty(shape, dt) for shape, dt in runner.output_types]
    base = {f"in{k}": a.ctypes.data for k, a in enumerate(values)}
    base.update({f"out{k}": a.ctypes.data for k, a in enumerate(outs)})
    base.update(weights=runner.weights.ctypes.data, workspace=runner._ws_ptr)
    calls = []
    for symbol, args in runner.info["call_args"]:
        fn = getattr(runner.lib, symbol)
        fn.restype = ctypes.c_int32
        calls.append((fn, [ctypes.c_void_p(base[b] + off) for b, off in args]))
    return runner, calls, (values, outs)


def kernels(m, feeds, runs: int) -> dict:
    """Each kernel of the entry called alone in the entry's order, `runs` times over: per kernel the
    median calling thread's CPU time and the pool's times (kiln_pool_times) per call."""
    import numpy as np
    runner, calls, _keep = _calls(m, feeds)   # (_keep: the arrays the calls point into)
    cpu = np.zeros((len(calls), runs))
    tms = np.zeros((len(calls), runs, 64))
    for r in range(runs):
        for k, (fn, ptrs) in enumerate(calls):
            s0 = _times(runner.lib)
            c = time.thread_time()
            fn(*ptrs)
            cpu[k, r] = time.thread_time() - c
            s1 = _times(runner.lib)
            if s0:
                tms[k, r] = [b - a for a, b in zip(s0, s1)]
    return {"what": list(runner.call_nodes), "cpu": np.median(cpu, axis=1).tolist(),
            "times": np.median(tms, axis=1).tolist()}


def handoff(m, feeds, runs: int) -> dict:
    """One thread (OMP_NUM_THREADS=1): the entry's kernels called in order from two Python threads
    pinned to two CPUs, each kernel's thread CPU time; "local": every kernel on the first thread,
    "remote": the kernels alternating between the threads, so each reads the output of the one
    before from the other core's cache. Per kernel the median over `runs` passes of each."""
    import threading

    import numpy as np
    runner, calls, _keep = _calls(m, feeds)   # (_keep: the arrays the calls point into)
    cpus = sorted(os.sched_getaffinity(0))[:2]
    todo = [threading.Semaphore(0), threading.Semaphore(0)]
    done = threading.Semaphore(0)
    times = {"local": np.zeros((len(calls), runs)), "remote": np.zeros((len(calls), runs))}
    job = {}

    def worker(me):
        os.sched_setaffinity(threading.get_native_id(), {cpus[me]})
        while True:
            todo[me].acquire()
            k = job["k"]
            if k < 0:
                return
            fn, ptrs = calls[k]
            t = time.thread_time()
            fn(*ptrs)
            job["t"] = time.thread_time() - t
            done.release()
    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    for r in range(2 * runs):
        mode = ("local", "remote")[r % 2]
        for k in range(len(calls)):
            job["k"] = k
            todo[k % 2 if mode == "remote" else 0].release()
            done.acquire()
            times[mode][k, r // 2] = job["t"]
    job["k"] = -1
    for s in todo:
        s.release()
    return {"what": list(runner.call_nodes), **{k: np.median(v, axis=1).tolist() for k, v in times.items()}}


def child(model: str, case: str, runs: int, out: str, per_kernel: bool = False, remote: bool = False) -> None:
    import numpy as np

    import kiln
    from benchmarks.corpus.build import one_case
    from kiln.runtime.threads import pool_counts
    path, _, feeds = one_case(model, case)
    m = kiln.compile(path, tier="full")   # (the -O3 build, as benchmarks.corpus times)
    for _ in range(5):
        m.run(feeds)
    if os.environ.get("PROBE_CALLER_CPU"):   # the caller kept on this CPU (the pool moves its worker off it)
        os.sched_setaffinity(0, {int(os.environ["PROBE_CALLER_CPU"])})
        for _ in range(5):
            m.run(feeds)
    if per_kernel or remote:
        with open(out, "w") as f:
            json.dump(handoff(m, feeds, runs) if remote else kernels(m, feeds, runs), f)
        return
    values = [np.asarray(x) for x in m.ordered(feeds)]
    runner = m.program.runner_for(values)
    lib = runner.lib if hasattr(runner, "lib") else None
    me = __import__("threading").get_native_id()
    rows = []
    for _ in range(runs):
        c0 = pool_counts(lib) if lib is not None else None
        s0 = _times(lib)
        t0 = _tasks()
        i0 = _irqs()
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        w, c = time.perf_counter(), time.thread_time()
        m.run(feeds)
        w, c = time.perf_counter() - w, time.thread_time() - c
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        i1 = _irqs()
        t1 = _tasks()
        c1 = pool_counts(lib) if lib is not None else None
        s1 = _times(lib)
        d = {tid: [b - a for a, b in zip(t0.get(tid, (0, 0, 0, 0)), v)] for tid, v in t1.items()}
        others = [v for tid, v in d.items() if tid != me and v[0] > 0]
        rows.append({"wall": w, "caller_cpu": c, "caller_run": d.get(me, [0] * 4)[0] / 1e9,
                     "caller_rq": d.get(me, [0] * 4)[1] / 1e9,
                     "workers_run": sum(v[0] for v in others) / 1e9, "workers_rq": sum(v[1] for v in others) / 1e9,
                     "vcsw": sum(v[2] for v in d.values()), "ivcsw": sum(v[3] for v in d.values()),
                     "minflt": r1.ru_minflt - r0.ru_minflt,
                     "tlb": i1.get("TLB", 0) - i0.get("TLB", 0), "cal": i1.get("CAL", 0) - i0.get("CAL", 0),
                     "counts": {k: c1[k] - c0[k] for k in c1} if c1 else {},
                     "times": [b - a for a, b in zip(s0, s1)]})
    huge = 0
    try:
        with open("/proc/self/smaps_rollup") as f:
            huge = next((int(ln.split()[1]) for ln in f if ln.startswith("AnonHugePages:")), 0)
    except OSError:
        pass
    for r in rows:
        r["huge_kb"] = huge
    with open(out, "w") as f:
        json.dump(rows, f)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("case")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--kernels", type=int, default=0, help="list the N kernels whose work grows most from 1 "
                    "to 2 threads (KILN_POOL_TIMES=2: each thread's CPU time in chunks)")
    ap.add_argument("--handoff", type=int, default=0, help="one thread: list the N kernels that lose most when "
                    "the kernel before ran on the other core (its output in that core's cache)")
    ap.add_argument("--child", metavar="OUT", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.model, args.case, args.runs, args.child, args.kernels > 0, args.handoff > 0)
        return
    import numpy as np
    if args.handoff:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "h.json")
            subprocess.run([sys.executable, os.path.abspath(__file__), args.model, args.case, "--runs", str(args.runs),
                            "--handoff", "1", "--child", out], env=dict(os.environ, OMP_NUM_THREADS="1"), check=True)
            with open(out) as f:
                got = json.load(f)
        loc, rem = np.array(got["local"]), np.array(got["remote"])
        print(f"{args.model} [{args.case}] one thread, kernels from two threads on two CPUs, thread CPU time, median "
              f"of {args.runs}: all on one {loc.sum() * 1e3:.2f} ms, alternating {rem.sum() * 1e3:.2f} ms "
              f"(x{rem.sum() / loc.sum():.3f}); load {os.getloadavg()[0]:.1f}")
        print(f"  {'local':>7s} {'remote':>7s} {'ratio':>5s}  kernel (ms)")
        for k in sorted(range(len(loc)), key=lambda k: -(rem[k] - loc[k]))[:args.handoff]:
            print(f"  {loc[k] * 1e3:7.3f} {rem[k] * 1e3:7.3f} {rem[k] / max(loc[k], 1e-9):5.2f}  {got['what'][k][:90]}")
        return
    counts = [int(x) for x in args.threads.split(",")]
    if args.kernels:
        got = {}
        with tempfile.TemporaryDirectory() as tmp:
            for n in counts:
                out = os.path.join(tmp, f"{n}.json")
                env = dict(os.environ, OMP_NUM_THREADS=str(n), KILN_POOL_TIMES="2")
                subprocess.run([sys.executable, os.path.abspath(__file__), args.model, args.case, "--runs",
                                str(args.runs), "--kernels", "1", "--child", out], env=env, check=True)
                with open(out) as f:
                    got[n] = json.load(f)
        one, two = got[counts[0]], got[counts[-1]]
        rows = []
        for k, what in enumerate(one["what"]):
            t = np.array(two["times"][k]).reshape(-1, 4)
            work = t[:, 0].sum() / 1e9 if t[:, 1].sum() else two["cpu"][k]
            rows.append((work - one["cpu"][k], one["cpu"][k], work, t[0][0] / 1e9, t[1][0] / 1e9, t[0][3] / 1e9, what))
        print(f"{args.model} [{args.case}] kernels alone, median of {args.runs}: 1 thread CPU "
              f"{sum(r[1] for r in rows) * 1e3:.2f} ms, {counts[-1]} threads CPU in chunks "
              f"{sum(r[2] for r in rows) * 1e3:.2f} ms (caller {sum(r[3] for r in rows) * 1e3:.2f}, worker "
              f"{sum(r[4] for r in rows) * 1e3:.2f}, caller at joins {sum(r[5] for r in rows) * 1e3:.2f}); load "
              f"{os.getloadavg()[0]:.1f}")
        print(f"  {'1 thr':>7s} {'2 work':>7s} {'ratio':>5s} {'caller':>7s} {'worker':>7s} {'join':>6s}  kernel (ms)")
        for r in sorted(rows, key=lambda r: -r[0])[:args.kernels]:
            print(f"  {r[1] * 1e3:7.3f} {r[2] * 1e3:7.3f} {r[2] / max(r[1], 1e-9):5.2f} {r[3] * 1e3:7.3f} "
                  f"{r[4] * 1e3:7.3f} {r[5] * 1e3:6.3f}  {r[6][:90]}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for n in counts if r % 2 == 0 else counts[::-1]:
                out = os.path.join(tmp, f"{n}-{r}.json")
                env = dict(os.environ, OMP_NUM_THREADS=str(n))
                subprocess.run([sys.executable, os.path.abspath(__file__), args.model, args.case, "--runs",
                                str(args.runs), "--child", out], env=env, check=True)
                with open(out) as f:
                    rows = json.load(f)
                med = {k: float(np.median([x[k] for x in rows])) for k in rows[0] if k not in ("counts", "times")}
                cnt = {k: float(np.sum([x["counts"][k] for x in rows])) / len(rows) for k in rows[0]["counts"]}
                print(f"{args.model} [{args.case}] {n} thr round {r}: wall {med['wall'] * 1e3:.2f} ms "
                      f"(p10 {np.percentile([x['wall'] for x in rows], 10) * 1e3:.2f}), caller cpu "
                      f"{med['caller_cpu'] * 1e3:.2f}, workers on cpu {med['workers_run'] * 1e3:.2f}, rq wait caller "
                      f"{med['caller_rq'] * 1e3:.2f} workers {med['workers_rq'] * 1e3:.2f}, switches vol "
                      f"{med['vcsw']:.0f} invol {med['ivcsw']:.0f}, minflt {med['minflt']:.0f}, TLB shootdowns "
                      f"{np.mean([x['tlb'] for x in rows]):.1f} call IPIs {np.mean([x['cal'] for x in rows]):.1f} (machine), "
                      f"huge pages {rows[0].get('huge_kb', 0) / 1024:.0f} MB; per run "
                      + ", ".join(f"{k} {v:.1f}" for k, v in cnt.items() if v) + f"; load {os.getloadavg()[0]:.1f}")
                if rows[0]["times"] and any(rows[0]["times"]):
                    tm = np.median(np.array([x["times"] for x in rows], dtype=float), axis=0).reshape(-1, 4)
                    print("   in chunks ms (chunks): " + ", ".join(f"thr{k} {t[0] / 1e6:.2f} ({t[1]:.0f})"
                                                              for k, t in enumerate(tm) if t[1])
                          + f"; caller in forks {tm[0][2] / 1e6:.2f}, at joins {tm[0][3] / 1e6:.2f}")


if __name__ == "__main__":
    main()
