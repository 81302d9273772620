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


def run_job(job: dict) -> dict:
    """job: library path, symbol, arrays (inputs then outputs, in param order), n_in,
    min_seconds (per repeat), repeats, number (calls per repeat; 0: chosen here)."""
    lib = ctypes.CDLL(job["path"])
    fn = getattr(lib, job["symbol"])
    fn.restype = ctypes.c_int32
    arrays = [np.ascontiguousarray(a) for a in job["arrays"]]
    ptrs = [ctypes.c_void_p(a.ctypes.data) for a in arrays]
    rc = fn(*ptrs)   # the first call: its outputs are checked by the parent
    if rc != 0:
        return {"error": f"kernel returned status {rc}"}
    outputs = [a.copy() for a in arrays[job["n_in"]:]]
    clock = time.perf_counter
    t0 = clock()
    fn(*ptrs)
    once = max(clock() - t0, 1e-7)
    number = job.get("number") or max(1, int(job["min_seconds"] / once))
    times = []
    for _ in range(job["repeats"]):
        t0 = clock()
        for _ in range(number):
            fn(*ptrs)
        times.append((clock() - t0) / number)
    return {"outputs": outputs, "times": times}


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
