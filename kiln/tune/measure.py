"""Build candidates in parallel, time them in a worker process, check their outputs.

`Measurer.measure(task, batch)` lowers each candidate (decisions -> kernel, in this
process: lowering errors are KilnErrors), emits and compiles the C of the whole batch
in parallel (the C build cache keeps them), then times each in the worker (kiln.tune.worker)
under a timeout. The first output of each candidate is compared with the default
schedule's on the same random inputs; a mismatch, a crash, a hang or a failed build is a
Result with an error (recorded, never applied).

Times are the minimum over `repeats` repeats of at least `min_seconds` each: on a loaded
machine the minimum is the estimate least disturbed by other processes. Once a task's
default is built, every candidate is timed in turn with it, repeat by repeat, in the same
job (interleaved): `Result.ratio` is the candidate's minimum over the default's, taken in the
same seconds, which is what the search ranks (kiln.tune.tuner). The clock is the wall clock
with the model's threads ("wall": what a quiet machine's tuning run measures), or
("cpu") the measuring thread's CPU time with the worker on one thread: on a loaded machine
that is the only meaningful signal, and it judges everything but the thread decisions
(THREAD_DECISIONS, which a one-thread tuning run leaves at their defaults).
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection

import numpy as np

from kiln.errors import KilnError
from kiln.tune.space import lower_with, taken
from kiln.tune.tasks import Task, random_inputs


@dataclass
class Result:
    decisions: dict                # as asked
    seconds: float | None = None
    taken: dict | None = None      # as the kernel took them (kiln.tune.space.taken): what is recorded
    error: str | None = None
    features: np.ndarray | None = None
    func: object = None
    ratio: float | None = None     # seconds / the default's, timed in turn with it (None: not interleaved)
    base_seconds: float | None = None   # the default's time in that same job


CLOCKS = ("wall", "cpu")
# decisions only a run on the model's threads can judge: a one-thread ("cpu" clock) run keeps their defaults
THREAD_DECISIONS = frozenset({"parallel_min_work", "fork_gain"})


class Worker:
    """One measuring process, restarted after a crash or a timeout. `threads`: its OpenMP
    threads (None: as this process would run them); its threads wait between kernels as
    kiln's runtime makes them (kiln.runtime.threads), so a fork costs what it costs in a model."""

    def __init__(self, timeout: float = 60.0, threads: int | None = None):
        self.timeout, self.threads = timeout, threads
        self._proc = self._conn = self._send = None
        self.restarts = 0

    def _start(self) -> None:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from kiln.runtime.threads import with_defaults  # noqa: PLC0415
        env = with_defaults(dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])))
        if self.threads is not None:
            env["OMP_NUM_THREADS"] = str(self.threads)
        self._proc = subprocess.Popen([sys.executable, "-m", "kiln.tune.worker"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, env=env)
        self._send = Connection(os.dup(self._proc.stdin.fileno()), readable=False)
        self._conn = Connection(os.dup(self._proc.stdout.fileno()), writable=False)
        self._proc.stdin.close()
        self._proc.stdout.close()

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait(5)
        self._drop()
        self.restarts += 1

    def _drop(self) -> None:
        for c in (self._send, self._conn):
            if c is not None:
                c.close()
        self._proc = self._conn = self._send = None

    def run(self, job: dict) -> dict:
        """The worker's answer to `job`, or {"error": ...} when it crashed or ran past the timeout."""
        if self._proc is not None and self._proc.poll() is not None:
            self._kill()
        if self._proc is None:
            self._start()
        try:
            self._send.send(job)
            if not self._conn.poll(self.timeout):
                self._kill()
                return {"error": f"timed out after {self.timeout:g} s"}
            return self._conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
            code = self._proc.wait(5) if self._proc is not None else None
            self._kill()
            return {"error": f"the measuring process died (exit code {code})"}

    def close(self) -> None:
        if self._proc is not None:
            try:
                self._send.send(None)
                self._proc.wait(2)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait(5)
            self._drop()


def build_many(funcs: list, jobs: int | None = None) -> list:
    """Each PrimFunc compiled to a shared library (in parallel); per func its path or the
    KilnError that stopped it."""
    from kiln.codegen.build import compile_c  # noqa: PLC0415
    from kiln.codegen.c import emit_c  # noqa: PLC0415
    from kiln.loops.stmt import LoopModule  # noqa: PLC0415

    from kiln.codegen.fork_cost import calibrated  # noqa: PLC0415
    from kiln.targets.target import Target  # noqa: PLC0415
    target = calibrated(Target.host())   # candidates are measured here (with kiln.compile's target)

    def one(f):
        try:
            return compile_c(emit_c(LoopModule([f]), target.threads_impl), target)
        except KilnError as e:
            return e
    if jobs is None:
        from kiln.tune.signature import machine  # noqa: PLC0415
        jobs = machine()["cores"]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(one, funcs))


class Measurer:
    """Measures candidates of tasks; keeps each task's inputs and reference outputs."""

    def __init__(self, timeout: float = 60.0, repeats: int = 5, min_seconds: float = 0.01,
                 rtol: float = 1e-3, atol: float = 1e-4, featurize=None, clock: str = "wall",
                 interleave: bool = True):
        if clock not in CLOCKS:
            raise KilnError(f"unknown measurement clock {clock!r}: one of {list(CLOCKS)}")
        self.clock, self.interleave = clock, interleave
        self.worker = Worker(timeout, threads=1 if clock == "cpu" else None)
        self.repeats, self.min_seconds, self.rtol, self.atol = repeats, min_seconds, rtol, atol
        self.featurize = featurize
        self._ref: dict[str, tuple] = {}   # task key -> (inputs, reference outputs)
        self._base: dict[str, dict] = {}   # task key -> the default's kernel: {"path", "symbol"}

    def close(self) -> None:
        self.worker.close()

    def lower(self, task: Task, decisions: dict) -> Result:
        """The candidate's kernel and features (or the error lowering it gave)."""
        try:
            kernel = lower_with(task.ctx, decisions)
        except KilnError as e:
            return Result(decisions, error=f"lowering: {e}")
        from kiln.loops.stmt import PrimFunc  # noqa: PLC0415
        from kiln.tune.features import decision_features  # noqa: PLC0415
        feats = None if self.featurize is None else self.featurize(kernel.func) \
            if isinstance(kernel.func, PrimFunc) else decision_features(taken(kernel))   # hand-written C
        return Result(decisions, features=feats, func=kernel.func, taken=taken(kernel))

    def job(self, task: Task, r: Result) -> dict | str:
        """The worker job timing candidate `r` (without its library path), or why there is none."""
        from kiln.codegen.c import func_symbol  # noqa: PLC0415
        if task.key not in self._ref:
            self._ref[task.key] = (random_inputs(r.func, task.inputs), None)
        arrays, _ = self._ref[task.key]
        if len(arrays) != len(r.func.params) or any(
                a.shape != tuple(p.shape) or a.dtype != p.dtype.np for a, p in zip(arrays, r.func.params)):
            return "the candidate's kernel has other parameters than the default's"
        job = {"symbol": func_symbol(r.func.name), "arrays": arrays, "n_in": len(task.inputs),
               "min_seconds": self.min_seconds, "repeats": self.repeats, "clock": self.clock}
        if self.interleave and task.key in self._base:
            job["base"] = self._base[task.key]
        return job

    def run_jobs(self, funcs: list, jobs: list[dict]) -> list[dict]:
        """Build each func and run its job in the worker process (kiln.tune.distributed does
        both on a Ray cluster instead)."""
        out = []
        for lib, job in zip(build_many(funcs), jobs):
            out.append({"error": f"build: {lib}"} if isinstance(lib, KilnError) else
                       {**self.worker.run({**job, "path": str(lib)}), "path": str(lib)})
        return out

    def measure(self, task: Task, results: list[Result]) -> list[Result]:
        """Build and time lowered candidates (Results from `lower`); fills seconds or error.
        A task's first measured candidate must be its default schedule: the reference."""
        todo = []
        for r in results:
            if r.error is None and r.func is not None:
                job = self.job(task, r)
                if isinstance(job, str):
                    r.error = job
                else:
                    todo.append((r, job))
        answers = self.run_jobs([r.func for r, _ in todo], [j for _, j in todo])
        for (r, job), ans in zip(todo, answers):
            if "error" in ans:
                r.error = ans["error"]
                continue
            arrays, want = self._ref[task.key]
            if want is None:   # the first candidate of a task is its default schedule
                self._ref[task.key] = (arrays, ans["outputs"])
                if ans.get("path"):
                    self._base[task.key] = {"path": ans["path"], "symbol": job["symbol"]}
            elif not all(np.allclose(g, w, rtol=self.rtol, atol=self.atol, equal_nan=True)
                         for g, w in zip(ans["outputs"], want)):
                r.error = "wrong output (differs from the default schedule's)"
                continue
            r.seconds = float(min(ans["times"]))
            if ans.get("base_times"):
                r.base_seconds = float(min(ans["base_times"]))
                r.ratio = r.seconds / r.base_seconds
        return results
