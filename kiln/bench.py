"""Measuring kiln against its peers (ONNX Runtime, PyTorch) in one process.

The PyTorch peer is eager torch running kiln's imported graph op by op
(kiln.peers.torch_graph); it needs the torch extra (pip install -e ".[torch]").

Runs are interleaved — alternating rounds of each engine — so drift in clocks
or machine load hits all alike; results are median, p10 and p90. Used by
`kiln bench` and by `benchmarks/run.py`.
"""

from __future__ import annotations

import math
import os
import resource
import tempfile
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import numpy as np

from kiln.errors import KilnError
from kiln.targets.target import host_cores

PEERS = ("ort", "torch")


def stats(ms: list[float]) -> dict:
    p10, med, p90 = np.percentile(ms, [10, 50, 90])
    return {"median_ms": float(med), "p10_ms": float(p10), "p90_ms": float(p90), "n": len(ms)}


SWITCH_PAUSE_S = 0.05  # between engines: longer than ORT's and libgomp's spin-waits


def thread_cpu_ns() -> dict[int, int]:
    """CPU ns so far of every thread of this process (Linux schedstat; {} elsewhere)."""
    out = {}
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return out
    for t in tasks:
        try:
            with open(f"/proc/self/task/{t}/schedstat") as f:
                out[int(t)] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return out


def time_interleaved(fns: dict, runs: dict, rounds: int, record: list | None = None) -> dict:
    """Alternate rounds of a few runs of each fn; returns {name: [ms per run]}.

    Each round starts with a pause and one untimed run: the engine timed before may leave
    threads spinning after its last call (ONNX Runtime's and PyTorch's pools do by default),
    and those take a core from whatever runs next; the pause lets them go to sleep and the
    untimed run wakes the next engine's own, for every engine alike.

    `record`, a list: one dict per timed run is appended (engine, round, index in the round,
    ms, and, probed outside the timed span, what happened meanwhile: see run_probe; what
    benchmarks/spread.py attributes slow runs by)."""
    times = {k: [] for k in fns}
    stat = _schedstat() if record is not None else None
    for r in range(rounds):
        for name, fn in fns.items():
            time.sleep(SWITCH_PAUSE_S)
            fn()
            for k in range(math.ceil(runs[name] / rounds)):
                if record is not None:
                    before = run_probe(stat)
                t = time.perf_counter()
                fn()
                t = time.perf_counter() - t
                times[name].append(t * 1e3)
                if record is not None:
                    record.append({"engine": name, "round": r, "k": k, "ms": t * 1e3,
                                   **probe_delta(before, run_probe(stat))})
    if stat is not None:
        os.close(stat)
    return times


def _sched_getcpu():
    try:
        import ctypes
        f = ctypes.CDLL(None).sched_getcpu
        f.restype = ctypes.c_int
        return f
    except (OSError, AttributeError):
        return lambda: -1


_getcpu = _sched_getcpu()


def _schedstat() -> int | None:
    """A descriptor of the calling thread's Linux schedstat (None where there is none)."""
    try:
        return os.open("/proc/thread-self/schedstat", os.O_RDONLY)
    except OSError:
        return None


def run_probe(stat: int | None = None) -> tuple:
    """What the process and the calling thread have had so far: rusage (page faults, context
    switches), the thread's CPU time, its time waiting on a run queue (ns, from `stat`, a
    _schedstat() descriptor; -1 where unknown) and the CPU it is on. A few microseconds."""
    try:
        wait = int(os.pread(stat, 128, 0).split()[1]) if stat is not None else -1
    except (OSError, IndexError, ValueError):
        wait = -1
    return resource.getrusage(resource.RUSAGE_SELF), time.thread_time(), wait, _getcpu()


def probe_delta(a: tuple, b: tuple) -> dict:
    """Between two run_probe()s: page faults, voluntary and involuntary context switches (the
    process's), the calling thread's CPU ms and run-queue wait ms, and its CPU before and after."""
    return {"minflt": b[0].ru_minflt - a[0].ru_minflt, "majflt": b[0].ru_majflt - a[0].ru_majflt,
            "nvcsw": b[0].ru_nvcsw - a[0].ru_nvcsw, "nivcsw": b[0].ru_nivcsw - a[0].ru_nivcsw,
            "cpu_ms": (b[1] - a[1]) * 1e3, "wait_ms": (b[2] - a[2]) / 1e6 if a[2] >= 0 <= b[2] else None,
            "cpu_before": a[3], "cpu_after": b[3]}


def compare(got: dict, want: dict, rtol: float = 1e-3, atol: float = 1e-4) -> dict:
    """Max abs error, max rel error (|d| / (|want| + atol)) and allclose over all outputs."""
    abs_err = rel_err = 0.0
    ok = set(got) == set(want)
    for name, w in want.items():
        g = np.asarray(got.get(name, np.full_like(w, np.nan)))
        if g.shape != w.shape:
            return {"max_abs": math.inf, "max_rel": math.inf, "ok": False,
                    "why": f"{name}: shape {g.shape} != {w.shape}"}
        d = np.abs(g.astype(np.float64) - w)
        abs_err = max(abs_err, float(d.max(initial=0)))
        rel_err = max(rel_err, float((d / (np.abs(w) + atol)).max(initial=0)))
        ok &= bool(np.allclose(g, w, rtol=rtol, atol=atol))
    return {"max_abs": abs_err, "max_rel": rel_err, "ok": ok}


def time_thread_cpu(fns: dict, runs: int) -> dict:
    """Alternate single runs of each fn, timing the calling thread's CPU time; returns {name:
    [ms per run]}. For one-thread engines on a loaded machine: time other processes take from
    the core is not counted (caches are still shared)."""
    times = {k: [] for k in fns}
    for _ in range(runs):
        for name, fn in fns.items():
            t0 = time.thread_time()
            fn()
            times[name].append((time.thread_time() - t0) * 1e3)
    return times


def ort_session(model, threads: int):
    """An ORT CPU session (model: path or ModelProto), `threads` intra-op threads, full optimisation."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise KilnError("comparing with ONNX Runtime needs it installed (pip install onnxruntime)") from None
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    src = os.fspath(model) if isinstance(model, (str, os.PathLike)) else model.SerializeToString()
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


def peer(name: str, model_path: str, threads: int):
    """A function feeds -> {output name: array} running the ONNX model on peer `name`."""
    if name == "ort":
        try:
            sess = ort_session(model_path, threads)
        except KilnError:
            raise
        except Exception as e:  # ORT's own errors (unsupported IR version, op, ...)
            raise KilnError(f"onnxruntime cannot load {model_path}: {str(e).splitlines()[0]}") from None
        names = [o.name for o in sess.get_outputs()]
        return lambda feeds: dict(zip(names, sess.run(None, feeds)))
    if name == "torch":
        return _torch_peer(model_path, threads)
    raise KilnError(f"unknown peer {name!r}; choose from {list(PEERS)}")


def _torch_peer(model_path: str, threads: int):
    """PyTorch eager on the ONNX model: kiln's graph run op by op with torch functions."""
    from kiln.peers.torch_graph import TorchGraph
    return TorchGraph(model_path, threads)


@contextmanager
def fresh_cache():
    """Point kiln's build cache at an empty folder for the block: a truly cold compile."""
    old = os.environ.get("KILN_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="kiln-cold-") as d:
        os.environ["KILN_CACHE_DIR"] = d
        try:
            yield d
        finally:
            from kiln.targets.tiered import wait_all  # noqa: PLC0415
            wait_all()   # (the background builds writing into it: kiln.codegen.tiers)
            if old is None:
                os.environ.pop("KILN_CACHE_DIR", None)
            else:
                os.environ["KILN_CACHE_DIR"] = old


def compile_cold_warm(compile_fn, times: list | None = None):
    """Call `compile_fn()` on an empty kiln cache, then again on the cache it filled.

    Returns (what the warm call returned, cold seconds, warm seconds); `times`, if given,
    receives the cold and the warm call's kiln.timing.StageTimes.
    """
    from kiln.timing import recording
    with fresh_cache():
        t = time.perf_counter()
        with recording() as cold_times:
            compile_fn()
        cold = time.perf_counter() - t
        t = time.perf_counter()
        with recording() as warm_times:
            model = compile_fn()
        warm = time.perf_counter() - t
    if times is not None:
        times += [cold_times, warm_times]
    return model, cold, warm


@dataclass
class BenchResult:
    target: str
    threads: int
    runs: int
    cold_s: float                 # compile + first run on an empty cache
    warm_s: float                 # the same again, the cache filled
    times: dict = field(default_factory=dict)    # engine -> stats()
    checks: dict = field(default_factory=dict)   # peer -> compare(kiln, peer), each peer that ran
    skipped: dict = field(default_factory=dict)  # peer -> why it did not run
    kernels: list = field(default_factory=list)  # (what, median s) per kernel call (profile=True)
    cold_stages: object = None    # kiln.timing.StageTimes of the cold compile (and first run)
    warm_stages: object = None    # ... and of the warm one


def bench_model(path: str, *, peers=("ort",), threads: int | None = None, runs: int = 50, seed: int = 0,
                target: str = "cpu", dims: dict | None = None, options: dict | None = None,
                step=lambda what: nullcontext(), profile: bool = False) -> BenchResult:
    """Compile the ONNX model at `path` cold and warm, check it against the peers, time all
    interleaved. `step(what)` is a context manager around each long step (progress display).
    `profile`: also time kiln's kernels one by one (cpu target; `BenchResult.kernels`)."""
    import kiln
    from kiln.compiler import spec_of
    from kiln.runtime.inputs import random_inputs
    bad = [p for p in peers if p not in PEERS]
    if bad:
        raise KilnError(f"unknown peer(s) {bad}; choose from {list(PEERS)}")
    threads = threads or host_cores()
    os.environ["OMP_NUM_THREADS"] = str(threads)  # read when kiln's first library loads libgomp
    with step(f"importing {path}"):
        graph = kiln.load_onnx(path)
    feeds = random_inputs([spec_of(v) for v in graph.inputs], dims, seed)

    def build():  # compile, and run once: a model with symbolic dims builds its kernels then
        m = kiln.compile(kiln.load_onnx(path), target=target, **(options or {}))
        return m, m.run(feeds)   # (to the first result: a big module's quick tier, kiln.codegen.tiers)
    with step(f"compiling {len(graph.nodes)} nodes for {target}, cold then warm"):
        stages = []
        (model, got), cold, warm = compile_cold_warm(build, stages)
    model.wait_optimized()   # the runs timed below run the -O3 build
    res = BenchResult(target, threads, runs, cold, warm, cold_stages=stages[0], warm_stages=stages[1])
    fns = {"kiln": lambda: model.run(feeds)}
    for name in peers:
        try:
            with step(f"loading {name}"):
                run_peer = peer(name, path, threads)
                want = run_peer(feeds)
        except KilnError as e:
            res.skipped[name] = str(e)
            continue
        res.checks[name] = compare(got, want)
        fns[name] = (lambda f: lambda: f(feeds))(run_peer)
    with step(f"timing {runs} runs of {', '.join(fns)}, interleaved"):
        times = time_interleaved(fns, {k: runs for k in fns}, rounds=max(1, min(10, runs)))
    res.times = {k: stats(v) for k, v in times.items()}
    if profile:
        if not hasattr(model, "profile"):
            raise KilnError(f"per-kernel profiles need the cpu target, not {target!r}")
        with step("timing each kernel"):
            res.kernels = model.profile(feeds, runs=max(3, min(runs, 20)))
    return res
