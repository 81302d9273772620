"""Run untrusted test cases in subprocesses with a wall-time and a memory limit.

A fuzzing case may crash the process (a segfault in native code, an abort),
hang, or exhaust memory; none of that may take the fuzzer down with it. Cases
are run in batches by a worker subprocess (`python -m kiln.testing.sandbox`),
so starting Python and importing kiln is paid once per batch, not per case.
The worker reports on a pipe when each case starts and how it ended; the
parent gives every case `timeout_s` seconds. When the worker dies or a case
overruns, the parent records that case as a crash or hang, kills the worker's
whole process group (C compilers included) and starts a new worker at the next
case.

Every case ends in one of five outcomes:

    ok          it ran to the end
    kiln_error  it raised KilnError (or a subclass): a clear, expected rejection
    exception   it raised anything else (a bug: the detail holds the traceback)
    crash       the worker died (a signal, or an exit without a report)
    hang        it ran past the time limit

Only `ok` and `kiln_error` pass. The worker runs under RLIMIT_AS (`memory_bytes`)
and without core dumps; KILN_MAX_MEMORY and KILN_MAX_TRIP_COUNT are set below
that, so kiln's own limits fire before the kernel's.
"""

from __future__ import annotations

import importlib
import json
import os
import pickle
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Callable

from kiln.limits import physical_memory

PASSING = ("ok", "kiln_error")
STARTUP_S = 60.0   # a worker's start (Python, numpy, kiln imported) before its first case, at most
OUTCOMES = ("ok", "kiln_error", "exception", "crash", "hang")


@dataclass
class Outcome:
    index: int       # the case's position in the list given to `run_cases`
    kind: str        # one of OUTCOMES
    detail: str      # the error message, traceback, signal or stderr tail
    seconds: float

    @property
    def failed(self) -> bool:
        return self.kind not in PASSING


@dataclass
class Sandbox:
    """How cases run: `worker` ("module:function", called with one case), limits, parallelism."""
    worker: str
    timeout_s: float = 60.0
    memory_bytes: int = 4 << 30
    jobs: int = 1
    batch: int = 50            # cases per worker process before it is replaced (fresh state)
    env: dict | None = None    # extra environment for the workers

    def run(self, cases: list, on_outcome: Callable[[Outcome], None] | None = None) -> list[Outcome]:
        """Run every case; returns one Outcome per case, in case order."""
        results: list[Outcome | None] = [None] * len(cases)
        lock = threading.Lock()
        chunks = [list(range(i, min(i + self.batch, len(cases)))) for i in range(0, len(cases), self.batch)]

        def record(o: Outcome) -> None:
            with lock:
                results[o.index] = o
                if on_outcome is not None:
                    on_outcome(o)

        def lane() -> None:
            while True:
                with lock:
                    if not chunks:
                        return
                    chunk = chunks.pop(0)
                self._run_chunk([cases[i] for i in chunk], chunk, record)

        threads = [threading.Thread(target=lane, daemon=True) for _ in range(max(1, self.jobs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return [r for r in results if r is not None]

    def _run_chunk(self, cases: list, indices: list[int], record) -> None:
        with tempfile.TemporaryDirectory(prefix="kiln-sandbox-") as tmp:
            path = os.path.join(tmp, "cases.pickle")
            with open(path, "wb") as f:
                pickle.dump(cases, f)
            start = 0
            while start < len(cases):
                start = self._run_worker(path, start, indices, record, tmp)

    def _run_worker(self, path: str, start: int, indices: list[int], record, tmp: str) -> int:
        """One worker from case `start` on; returns where the next worker must start."""
        read_fd, write_fd = os.pipe()
        err_path = os.path.join(tmp, "stderr.txt")
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        path_env = os.pathsep.join(p for p in (root, os.getcwd(), os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "PYTHONPATH": path_env,  # the worker imports this kiln, not another
               "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"),
               "KILN_MAX_MEMORY": str(min(self.memory_bytes, physical_memory()) // 4),
               "KILN_MAX_CONSTANT": str(min(self.memory_bytes, physical_memory()) // 8),
               "KILN_MAX_TRIP_COUNT": "10000", **(self.env or {})}
        with open(err_path, "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "kiln.testing.sandbox", self.worker, path, str(write_fd), str(start)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env,
                pass_fds=(write_fd,), start_new_session=True,
                preexec_fn=_limits(self.memory_bytes))
        os.close(write_fd)
        lines = _Lines(read_fd)
        current, t0 = None, time.monotonic()
        try:
            while True:
                # a case has timeout_s; a fresh worker's start-up (imports: seconds on a loaded
                # machine) and the step between cases are not a case's time
                wait = self.timeout_s - (time.monotonic() - t0) if current is not None else \
                    max(self.timeout_s * 4, STARTUP_S)
                line = lines.next(max(wait, 0))
                if line is None:  # the case ran past its time (or the worker hangs starting up)
                    _kill(proc)
                    if current is None:
                        current = start
                    record(Outcome(indices[current], "hang", f"no result after {self.timeout_s:.0f} s",
                                   time.monotonic() - t0))
                    return current + 1
                if not line:  # the worker is gone
                    rc = proc.wait()
                    if current is None:
                        if rc == 0:
                            return len(indices)
                        current = start
                    record(Outcome(indices[current], "crash", _death(rc, err_path), time.monotonic() - t0))
                    return current + 1
                msg = json.loads(line)
                if "start" in msg:
                    current, t0 = msg["start"], time.monotonic()
                else:
                    record(Outcome(indices[msg["done"]], msg["kind"], msg["detail"], msg["seconds"]))
                    current = None
                    start = msg["done"] + 1
                    if start >= len(indices):
                        proc.wait()
                        return start
        finally:
            os.close(read_fd)
            if proc.poll() is None:
                _kill(proc)


class _Lines:
    """Lines from a pipe with a timeout (select on the raw fd; no hidden buffering)."""

    def __init__(self, fd: int):
        self.fd, self.buf = fd, b""

    def next(self, timeout: float) -> str | None:
        """The next line; "" at end of file; None if nothing came within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.fd], [], [], max(left, 0))
            if not ready:
                return None
            chunk = os.read(self.fd, 65536)
            if not chunk:
                return ""
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line.decode()


def _limits(memory_bytes: int):
    def apply() -> None:
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _death(rc: int, err_path: str) -> str:
    how = f"killed by signal {signal.Signals(-rc).name}" if rc < 0 else f"exited with status {rc}"
    try:
        with open(err_path, "rb") as f:
            tail = f.read()[-1500:].decode(errors="replace")
    except OSError:
        tail = ""
    return f"{how}; stderr: {tail.strip()}"


# ---------------------------------------------------------------- the worker side

def classify(fn: Callable, case) -> tuple[str, str]:
    """Run `fn(case)` and name its outcome (ok / kiln_error / exception) with a detail."""
    from kiln.errors import KilnError
    try:
        fn(case)
        return "ok", ""
    except KilnError as e:
        cause = e.__cause__
        wrapped = f"wraps {type(cause).__name__}; " if cause is not None and not isinstance(cause, KilnError) else ""
        return "kiln_error", f"{wrapped}{type(e).__name__}: {e}"[:500]
    except BaseException as e:  # noqa: BLE001 - anything else is what the fuzzer hunts
        return "exception", "".join(traceback.format_exception(type(e), e, e.__traceback__))[-3000:]


def _worker(spec: str, path: str, fd: int, start: int) -> None:
    module, _, name = spec.partition(":")
    fn = getattr(importlib.import_module(module), name)
    with open(path, "rb") as f:
        cases = pickle.load(f)
    out = os.fdopen(fd, "w", buffering=1)
    for i in range(start, len(cases)):
        out.write(json.dumps({"start": i}) + "\n")
        t0 = time.perf_counter()
        kind, detail = classify(fn, cases[i])
        out.write(json.dumps({"done": i, "kind": kind, "detail": detail,
                              "seconds": time.perf_counter() - t0}) + "\n")
    out.close()


if __name__ == "__main__":
    _worker(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
