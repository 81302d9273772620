"""Differential testing: one case compiled at -O levels on cpu, compared with the interpreter
(at -O0: the NumPy reference of the unoptimized graph) and with ONNX Runtime.

`check_case` runs in-process and returns `Finding`s. `WorkerPool` runs cases in worker
subprocesses (`python -m kiln.testing.differential --serve`) under a time and memory limit,
so that a crash or a hang in generated code is a finding, not the end of the run; a worker
that dies is replaced. `campaign` fuzzes a range of seeds with a pool.

A finding's `signature` names the bug class (kind, target, stage and the message with names
and numbers blanked): the shrinker keeps it while it removes nodes, and the campaign groups
findings by it.
"""

from __future__ import annotations

import os
import pickle
import re
import select
import signal
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from kiln.testing import sandbox
from kiln.targets.target import host_cores

# tolerances by dtype: (rtol, atol relative to the output's magnitude)
TOLERANCE = {"f2": (2e-2, 2e-2), "f4": (1e-4, 1e-5), "f8": (1e-9, 1e-12)}
ORT_TOLERANCE = {"f2": (3e-2, 3e-2), "f4": (1e-3, 1e-4), "f8": (1e-6, 1e-8)}


@dataclass
class Finding:
    """One disagreement or failure: kind is 'mismatch' (cpu or an -O level of the interpreter
    vs the reference), 'rerun-differs' (a second run of the same compiled model on the same
    inputs gave other bits), 'ort-mismatch' (the reference vs ONNX Runtime), 'error' (kiln raised,
    KilnError or not), 'crash' (the worker died: a signal), 'timeout'."""
    kind: str
    target: str            # "cpu", "interpreter", "ort"
    level: int | None
    message: str
    stage: str = ""

    @property
    def signature(self) -> str:
        return f"{self.kind}|{self.target}|{self.stage}|{normalize(self.message)}"

    def __str__(self) -> str:
        at = "" if self.level is None else f" -O{self.level}"
        return f"{self.kind} [{self.target}{at}] {self.message}"


def normalize(msg: str) -> str:
    """A message with value/node names, numbers and shapes blanked: its bug class."""
    msg = msg.splitlines()[0] if msg else ""
    msg = re.sub(r"'[^']*'|\"[^\"]*\"", "'_'", msg)
    msg = re.sub(r"%[\w.]+", "%_", msg)
    msg = re.sub(r"\b[a-z_]*\d+[\w.]*", "#", msg)
    msg = re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "#", msg)
    msg = re.sub(r"\[['_#, ]*\]|\(['_#, ]*\)", "[#]", msg)
    return msg[:160]


def compare(got, want, tol: dict) -> str | None:
    """None when `got` matches `want` (NaNs and infinities in the same places, floats within
    the dtype's tolerance scaled by the output's magnitude, everything else exactly), else why."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return f"shape {got.shape} != {want.shape}"
    if got.dtype != want.dtype:
        return f"dtype {got.dtype} != {want.dtype}"
    if want.dtype.kind != "f":
        bad = got != want
        if bad.any():
            k = int(np.argmax(bad.reshape(-1)))
            return f"{int(bad.sum())} of {want.size} differ, first at {k}: {got.reshape(-1)[k]} vs {want.reshape(-1)[k]}"
        return None
    rtol, atol = tol.get(want.dtype.str[1:], tol["f4"])
    g, w = got.astype(np.float64), want.astype(np.float64)
    if (np.isnan(g) != np.isnan(w)).any():
        return f"NaN in different places ({int(np.isnan(g).sum())} vs {int(np.isnan(w).sum())})"
    inf = np.isinf(w) | np.isinf(g)
    if (g[inf] != w[inf]).any():
        return "infinities differ"
    fin = np.isfinite(w) & np.isfinite(g)
    if not fin.any():
        return None
    scale = max(1.0, float(np.abs(w[fin]).max()))
    err = np.abs(g[fin] - w[fin])
    bound = atol * scale + rtol * np.abs(w[fin])
    if (err > bound).any():
        k = int(np.argmax(err - bound))
        return (f"max abs error {float(err.max()):.3g} (scale {scale:.3g}), e.g. {g[fin][k]!r} vs {w[fin][k]!r}, "
                f"{int((err > bound).sum())} of {want.size} elements")
    return None


def _compare_all(gots: list, wants: list, names: list, tol: dict) -> str | None:
    if len(gots) != len(wants):
        return f"{len(gots)} outputs, expected {len(wants)}"
    for name, g, w in zip(names, gots, wants):
        why = compare(g, w, tol)
        if why:
            return f"output {name}: {why}"
    return None


def _error_finding(e: BaseException, target: str, level) -> Finding:
    from kiln.errors import KilnError  # noqa: PLC0415
    if isinstance(e, KilnError):
        return Finding("error", target, level, str(e), getattr(e, "stage", "") or "")
    return Finding("error", target, level, f"internal {type(e).__name__}: {e}", "internal")


def run_ort(model_bytes: bytes, feeds: dict):
    """ONNX Runtime's outputs, or None when it refuses the model (or is not installed)."""
    try:
        import onnxruntime as ort  # noqa: PLC0415
    except ImportError:
        return None
    try:
        so = ort.SessionOptions()
        so.log_severity_level = 4
        so.intra_op_num_threads = 1
        sess = ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])
        return sess.run(None, feeds)
    except Exception:  # noqa: BLE001 - ORT not accepting a graph is not a kiln finding
        return None


def _uses_float16(model) -> bool:
    """ONNX Runtime's float16 kernels compute several ops in float32 without rounding between
    them (Add then Sqrt then Round differs from ONNX's per-op float16 results): no comparison."""
    from onnx import TensorProto  # noqa: PLC0415
    g = model.graph
    f16 = TensorProto.FLOAT16
    return (any(v.type.tensor_type.elem_type == f16 for v in g.input)
            or any(t.data_type == f16 for t in g.initializer)
            or any(a.name == "to" and a.i == f16 for n in g.node for a in n.attribute))


def check_case(model_bytes: bytes, feeds: dict, levels=(0, 1, 2, 3), *, use_ort: bool = True,
               targets=("cpu", "interpreter"), phase=None) -> list[Finding]:
    """Compile the model at each level for each target and compare with the reference.

    `phase(name)` is called before each step (the worker reports it, so that a crash is
    attributed to the step that crashed: kiln's compile, its generated code, or ORT).
    """
    import onnx  # noqa: PLC0415

    import kiln  # noqa: PLC0415
    phase = phase or (lambda name: None)
    model = onnx.load_from_string(model_bytes)
    names = [o.name for o in model.graph.output]
    findings: list[Finding] = []
    phase("reference")
    try:
        want = list(kiln.compile(model, target="interpreter", opt_level=0).run(feeds).values())
    except Exception as e:  # noqa: BLE001
        return [_error_finding(e, "interpreter", 0)]
    if use_ort and not _uses_float16(model):
        phase("ort")
        ort_out = run_ort(model_bytes, feeds)
        if ort_out is not None:
            why = _compare_all([np.asarray(o) for o in ort_out], want, names, ORT_TOLERANCE)
            if why:
                findings.append(Finding("ort-mismatch", "ort", None, why))
    for level in levels:
        for target in targets:
            if target == "interpreter" and level == 0:
                continue
            phase(f"{target} -O{level}")
            try:
                compiled = kiln.compile(model, target=target, opt_level=level)
                got = list(compiled.run(feeds).values())
                # a second run on the same inputs must repeat the first bit for bit (state
                # left in the arena, outputs accumulated into rather than written)
                again = list(compiled.run(feeds).values()) if target == "cpu" else got
            except Exception as e:  # noqa: BLE001
                findings.append(_error_finding(e, target, level))
                continue
            why = _compare_all(got, want, names, TOLERANCE)
            if why:
                findings.append(Finding("mismatch", target, level, why))
            elif _compare_all(again, got, names, {k: (0.0, 0.0) for k in TOLERANCE}):
                findings.append(Finding("rerun-differs", target, level,
                                        _compare_all(again, got, names, {k: (0.0, 0.0) for k in TOLERANCE})))
    return findings


# ---------------------------------------------------------------- worker subprocesses


def _send(f, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    f.write(struct.pack("<Q", len(data)) + data)
    f.flush()


def _recv_exact(f, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = f.read(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _serve() -> None:
    """Worker loop: read jobs from stdin, write ('phase', name) and ('done', findings) to the
    channel (the original stdout; fd 1 then points at stderr so that prints cannot corrupt it)."""
    chan = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    inp = sys.stdin.buffer
    while True:
        head = _recv_exact(inp, 8)
        if head is None:
            return
        job = pickle.loads(_recv_exact(inp, struct.unpack("<Q", head)[0]))
        if job.get("simulate"):   # the harness's own tests: a crash or a hang in a step
            _send(chan, ("phase", "cpu -O1"))
            if job["simulate"] == "crash":
                os.kill(os.getpid(), signal.SIGSEGV)
            time.sleep(3600)
        try:
            found = check_case(job["model"], job["feeds"], job["levels"], use_ort=job["ort"],
                               targets=job.get("targets", ("cpu", "interpreter")),
                               phase=lambda name: _send(chan, ("phase", name)))
        except Exception as e:  # noqa: BLE001
            found = [_error_finding(e, "harness", None)]
        _send(chan, ("done", found))


class Worker:
    """One worker subprocess; `start_job` then `poll` for its result."""

    def __init__(self, memory_limit: int, env: dict):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kiln.testing.differential", "--serve"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=sandbox._limits(memory_limit), env=env)
        self.job = None
        self.started = 0.0
        self.phase = ""
        self.buf = b""

    def start_job(self, key, job: dict) -> None:
        self.job, self.started, self.phase = key, time.monotonic(), "start"
        _send(self.proc.stdin, job)

    def read_messages(self) -> list | None:
        """The complete messages that have arrived (call when the pipe is readable); None
        when the worker has exited."""
        data = os.read(self.proc.stdout.fileno(), 1 << 20)
        if not data:
            return None
        self.buf += data
        out = []
        while len(self.buf) >= 8:
            n = struct.unpack("<Q", self.buf[:8])[0]
            if len(self.buf) < 8 + n:
                break
            out.append(pickle.loads(self.buf[8:8 + n]))
            self.buf = self.buf[8 + n:]
        return out

    def kill(self) -> None:
        sandbox._kill(self.proc)

    def exit_description(self) -> str:
        return sandbox._death(self.proc.wait(), os.devnull).split(";")[0]


class WorkerPool:
    """Run check jobs in `workers` subprocesses, each limited to `timeout` seconds per job and
    `memory_limit` bytes of address space. Compile caches are shared (same KILN_CACHE_DIR).
    A job's clock starts when its worker reports its first step: a fresh worker's start-up
    (seconds of imports on a loaded machine) is not the job's time; it has sandbox.STARTUP_S more."""

    def __init__(self, workers: int = 0, timeout: float = 120.0, memory_limit: int = 6 << 30,
                 threads: int = 1):
        self.n = workers or max(1, host_cores())
        self.timeout, self.memory_limit = timeout, memory_limit
        self.env = dict(os.environ)
        self.env.setdefault("OMP_NUM_THREADS", str(threads))
        here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        self.env["PYTHONPATH"] = os.pathsep.join([here] + [p for p in [os.environ.get("PYTHONPATH")] if p])
        self.workers: list[Worker] = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        for w in self.workers:
            try:
                w.proc.stdin.close()
            except OSError:
                pass
            w.kill()
        self.workers = []

    def run(self, jobs, on_result=None) -> dict:
        """Run `jobs` (an iterable of (key, job dict)); returns {key: [Finding]}. A crash in
        ONNX Runtime's step is retried without ORT (ORT's bugs are not kiln's)."""
        pending = list(jobs)
        pending.reverse()
        results: dict = {}
        retry_ort: dict = {}
        while pending or any(w.job is not None for w in self.workers):
            while len(self.workers) < self.n:
                self.workers.append(Worker(self.memory_limit, self.env))
            for w in list(self.workers):
                if w.job is None and pending:
                    key, job = pending.pop()
                    retry_ort[key] = job
                    try:
                        w.start_job(key, job)
                    except OSError:         # the idle worker had died: a new one takes the job
                        w.kill()
                        self.workers.remove(w)
                        pending.append((key, job))
            busy = [w for w in self.workers if w.job is not None]
            if not busy:
                continue
            now = time.monotonic()
            wait = max(0.01, min(self._deadline(w) - now for w in busy))
            ready, _, _ = select.select([w.proc.stdout.fileno() for w in busy], [], [], wait)
            for w in busy:
                key = w.job
                found = None
                if w.proc.stdout.fileno() in ready:
                    msgs = w.read_messages()
                    if msgs is None:                     # the worker died
                        why = w.exit_description()
                        self.workers.remove(w)
                        if w.phase == "ort":             # ORT crashed: run again without it
                            pending.append((key, dict(retry_ort[key], ort=False)))
                            continue
                        found = [Finding("crash", w.phase.split(" ")[0], _level_of(w.phase),
                                         f"worker {why} during {w.phase}")]
                    for msg in msgs or ():
                        if msg[0] == "phase":
                            if w.phase == "start":        # the job's first step: its clock starts
                                w.started = time.monotonic()
                            w.phase = msg[1]
                        else:
                            found, w.job = msg[1], None
                elif time.monotonic() > self._deadline(w):
                    w.kill()
                    self.workers.remove(w)
                    found = [Finding("timeout", w.phase.split(" ")[0], _level_of(w.phase),
                                     f"no result in {self.timeout:.0f} s (during {w.phase})")]
                if found is not None:
                    results[key] = found
                    retry_ort.pop(key, None)
                    if on_result:
                        on_result(key, found)
        return results


    def _deadline(self, w: Worker) -> float:
        return w.started + self.timeout + (sandbox.STARTUP_S if w.phase == "start" else 0.0)


def _level_of(phase: str):
    m = re.search(r"-O(\d)", phase)
    return int(m.group(1)) if m else None


def job_for_model(model, feeds: dict, levels, use_ort: bool = True,
                  targets=("cpu", "interpreter")) -> dict:
    """A worker job: check `model` on `feeds` at `levels` for `targets`."""
    return {"model": model.SerializeToString(), "feeds": feeds, "levels": tuple(levels),
            "ort": use_ort, "targets": tuple(targets)}


def job_for(case, use_ort: bool = True) -> dict:
    return job_for_model(case.model, case.feeds, case.levels, use_ort)


# ---------------------------------------------------------------- campaigns


@dataclass
class Campaign:
    """The outcome of fuzzing a range of seeds."""
    cases: int = 0
    seconds: float = 0.0
    findings: dict = field(default_factory=dict)    # seed -> [Finding]
    levels_run: dict = field(default_factory=dict)  # level -> number of cases compiled at it

    def by_signature(self) -> dict:
        """{signature: [(seed, finding)]}: the distinct failure classes."""
        out: dict = {}
        for seed, found in sorted(self.findings.items()):
            for f in found:
                out.setdefault(f.signature, []).append((seed, f))
        return out


def campaign(seeds, *, levels_per_graph: int = 4, workers: int = 0, use_ort: bool = True,
             timeout: float = 120.0, time_budget: float | None = None, pool: WorkerPool | None = None,
             on_result=None, batch: int = 0) -> Campaign:
    """Generate and check each seed's case; stop starting new ones after `time_budget` s."""
    from kiln.testing.fuzz_graphs import generate  # noqa: PLC0415
    out = Campaign()
    t0 = time.monotonic()
    own = pool is None
    pool = pool or WorkerPool(workers, timeout)
    seeds = list(seeds)
    step = batch or max(4 * pool.n, 8)
    try:
        for k in range(0, len(seeds), step):
            if time_budget is not None and time.monotonic() - t0 > time_budget:
                break
            cases = {s: generate(s, levels_per_graph) for s in seeds[k:k + step]}
            for c in cases.values():
                for lv in c.levels:
                    out.levels_run[lv] = out.levels_run.get(lv, 0) + 1

            def done(seed, found):
                if found:
                    out.findings[seed] = found
                if on_result:
                    on_result(seed, found)
            pool.run([(s, job_for(c, use_ort)) for s, c in cases.items()], done)
            out.cases += len(cases)
    finally:
        if own:
            pool.close()
    out.seconds = time.monotonic() - t0
    return out


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        from kiln.testing.differential import _serve as serve  # findings pickle by module name
        serve()
    else:
        sys.exit("usage: python -m kiln.testing.differential --serve (a fuzzer worker)")
