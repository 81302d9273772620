"""The measuring process: loads a candidate's library, runs it, times it.

It runs apart from kiln (`python -m kiln.tune.worker`, started by kiln.tune.measure; jobs and
answers are pickled over its stdin and stdout), so a candidate that crashes or hangs takes
down this process only; the parent sees the pipe close or its timeout pass, records the
failure and starts another worker. It imports only numpy and ctypes.
"""

from __future__ import annotations

import ctypes
import time

import numpy as np


def _kernel(path: str, symbol: str):
    fn = getattr(ctypes.CDLL(path), symbol)
    fn.restype = ctypes.c_int32
    return fn


def _aligned(a: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of `a` whose data starts on 64 bytes (kernels may load aligned vectors)."""
    a = np.ascontiguousarray(a)
    if a.ctypes.data % 64 == 0:
        return a
    raw = np.empty(a.nbytes + 64, np.uint8)
    off = (-raw.ctypes.data) % 64
    out = raw[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def run_job(job: dict) -> dict:
    """job: library path, symbol, arrays (inputs then outputs, in param order), n_in,
    n_out (optional: how many arrays after the inputs are outputs; default all: a whole
    module's entry takes its weights and workspace after them), min_seconds (per repeat),
    repeats, number (calls per repeat; 0: chosen here), clock ("wall": perf_counter; "cpu":
    this thread's CPU time, for a loaded machine, with the worker on one thread), base
    (optional {"path", "symbol"}, and "arrays" when it takes others: the default schedule's
    kernel or module, timed in turn with the candidate, repeat by repeat, so that both see
    the same moments of a noisy machine: `base_times` beside `times`)."""
    fn = _kernel(job["path"], job["symbol"])
    arrays = [_aligned(a) for a in job["arrays"]]
    ptrs = [ctypes.c_void_p(a.ctypes.data) for a in arrays]
    rc = fn(*ptrs)   # the first call: its outputs are checked by the parent
    if rc != 0:
        return {"error": f"kernel returned status {rc}"}
    n_in = job["n_in"]
    outputs = [a.copy() for a in arrays[n_in:n_in + job.get("n_out", len(arrays))]]
    base, base_ptrs = None, ptrs
    if job.get("base"):
        base = _kernel(job["base"]["path"], job["base"]["symbol"])
        if job["base"].get("arrays") is not None:
            base_arrays = [_aligned(a) for a in job["base"]["arrays"]]
            base_ptrs = [ctypes.c_void_p(a.ctypes.data) for a in base_arrays]
    clock = time.thread_time if job.get("clock") == "cpu" else time.perf_counter
    t0 = clock()
    fn(*ptrs)
    once = max(clock() - t0, 1e-7)
    if base is not None:   # the repeat's size from the slower of the two
        t0 = clock()
        base(*base_ptrs)
        once = max(once, clock() - t0)
    number = job.get("number") or max(1, int(job["min_seconds"] / once))

    def timed(f, args) -> float:
        t0 = clock()
        for _ in range(number):
            f(*args)
        return (clock() - t0) / number
    times, base_times = [], []
    for _ in range(job["repeats"]):
        if base is not None:
            base_times.append(timed(base, base_ptrs))
        times.append(timed(fn, ptrs))
    return {"outputs": outputs, "times": times, "base_times": base_times}


def serve(conn) -> None:
    """Answer jobs from the pipe until it closes (or a None job)."""
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        if job.get("crash"):        # for tests: a candidate that kills its process
            import os  # noqa: PLC0415
            os.abort()
        if job.get("hang"):         # for tests: a candidate that never returns
            while True:
                time.sleep(1)
        try:
            conn.send(run_job(job))
        except Exception as e:  # noqa: BLE001  a bad job is an answer, not the end of the worker
            conn.send({"error": f"{type(e).__name__}: {e}"})


def main() -> None:
    """Serve on stdin/stdout; the kernels' own writes to stdout go to stderr."""
    import os  # noqa: PLC0415
    import sys  # noqa: PLC0415
    from multiprocessing.connection import Connection  # noqa: PLC0415

    class Duplex:
        def __init__(self):
            self.r = Connection(os.dup(0), writable=False)
            self.w = Connection(os.dup(1), readable=False)
            os.dup2(2, 1)
            sys.stdout = sys.stderr

        def recv(self):
            return self.r.recv()

        def send(self, obj):
            self.w.send(obj)
    serve(Duplex())


if __name__ == "__main__":
    main()
