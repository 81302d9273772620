"""Measurement on a Ray cluster (`kiln tune --ray auto|ADDRESS`; the `ray` extra).

Candidates are lowered here; each is sent as one Ray task that emits nothing new: it
compiles the C source it is given and times the kernel in a measuring process of its own
(kiln.tune.worker, with the timeout), on whichever node Ray picks. The jobs of a batch
run at once across the cluster. A Ray worker that dies fails only its own jobs (no
retries: a candidate that kills a worker would kill the next one too); its records say so.
Timing on several machines only makes sense when they share one machine signature: the
records are stored under this machine's, so use a cluster of identical nodes.
"""

from __future__ import annotations

from kiln.errors import KilnError
from kiln.tune.measure import Measurer


def _remote_job(source: str, job: dict, timeout: float, threads: int | None = None) -> dict:
    """On a Ray worker: build `source`, time the job in a measuring process."""
    if job.get("kill_ray_worker"):   # for tests: a job that takes its Ray worker down
        import os  # noqa: PLC0415
        os._exit(1)
    from kiln.codegen.build import compile_c  # noqa: PLC0415
    from kiln.targets.target import Target  # noqa: PLC0415
    from kiln.tune.measure import Worker  # noqa: PLC0415
    try:
        path = compile_c(source, Target.host())
    except KilnError as e:
        return {"error": f"build: {e}"}
    w = Worker(timeout, threads)
    try:
        return w.run({**job, "path": str(path)})
    finally:
        w.close()


class RayMeasurer(Measurer):
    def __init__(self, address: str = "auto", timeout: float = 60.0, **kw):
        try:
            import ray  # noqa: PLC0415
        except ImportError:
            raise KilnError("--ray needs Ray: pip install 'kiln[ray]'") from None
        super().__init__(timeout=timeout, interleave=False, **kw)   # the default's library is not on the node
        self.ray = ray
        if not ray.is_initialized():
            ray.init(address=None if address == "local" else address, ignore_reinit_error=True,
                     log_to_driver=False)
        self._task = ray.remote(max_retries=0)(_remote_job)

    def run_jobs(self, funcs: list, jobs: list[dict]) -> list[dict]:
        from kiln.codegen.c import emit_c  # noqa: PLC0415
        from kiln.loops.stmt import LoopModule  # noqa: PLC0415
        ray = self.ray
        refs = [self._task.remote(emit_c(LoopModule([f])) if f is not None else "", job, self.worker.timeout,
                                  self.worker.threads)
                for f, job in zip(funcs, jobs)]
        out = []
        for ref in refs:
            try:
                out.append(ray.get(ref, timeout=self.worker.timeout * 4 + 300))
            except ray.exceptions.GetTimeoutError:
                ray.cancel(ref, force=True)
                out.append({"error": "the Ray job did not answer in time"})
            except ray.exceptions.RayError as e:
                out.append({"error": f"the Ray worker failed: {type(e).__name__}"})
        return out
