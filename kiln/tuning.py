"""Tuning a whole model: the compiler's stages give the graph, kiln.tune searches its kernels.

The driver above both rooms: kiln.compiler (which reads tuning records through
kiln.tune.apply) and kiln.tune (which lowers and measures kernels) never import each
other's drivers. `kiln tune` (kiln.cli) calls `tune_model`.
"""

from __future__ import annotations

import time

import numpy as np

from kiln.errors import KilnError
from kiln.tune.tasks import Task, tasks_of
from kiln.tune.tuner import TuneReport, tune


def specialized_graph(model, dims: dict | None = None, opt_level: int | None = None):
    """The model's graph as kiln would lower it (specialised to `dims` for symbolic inputs)."""
    from kiln.compiler import frontend, optimize, spec_of, specialize  # noqa: PLC0415
    from kiln.runtime.inputs import bind_dims, concrete_shape  # noqa: PLC0415
    if opt_level is None:
        from kiln.passes.pipeline import DEFAULT_LEVEL  # noqa: PLC0415
        opt_level = DEFAULT_LEVEL
    from kiln.targets.target import Target  # noqa: PLC0415
    opt = optimize(frontend(model), opt_level, Target.host())
    ins = [spec_of(v) for v in opt.graph.inputs]
    bound = bind_dims(ins, {}, dict(dims or {}))
    spec = specialize(opt, [concrete_shape(s, bound) for s in ins])
    if spec.breaks:
        raise KilnError("this model runs in stages (data-dependent shapes); kiln tune handles models "
                        "that are one native module: " + "; ".join(str(b) for b in spec.breaks))
    return spec.graph, spec.known


def extract_tasks(model, dims: dict | None = None) -> list[Task]:
    """A model's tuning tasks (kiln.tune.tasks), for the shapes `dims` binds."""
    graph, known = specialized_graph(model, dims)
    return tasks_of(graph, known)


def tune_model(model, db_path: str, budget_s: float, *, dims: dict | None = None, end_to_end: bool = True,
               **options) -> TuneReport:
    """Tune `model` for `budget_s` seconds into `db_path` (options: kiln.tune.tuner.tune's);
    then, unless interrupted, time it untuned and tuned (`report.end_to_end`)."""
    graph, known = specialized_graph(model, dims)
    report = tune(graph, known, db_path, budget_s, **options)
    if end_to_end and not report.interrupted:
        report.end_to_end = measure_end_to_end(model, db_path, dims)
    return report


def random_feeds(compiled, dims: dict | None = None, seed: int = 0) -> dict:
    from kiln.runtime.inputs import concrete_shape  # noqa: PLC0415
    rng = np.random.default_rng(seed)
    feeds = {}
    for s in compiled.inputs:
        shape = concrete_shape(s, dict(dims or {}))
        dt = np.dtype(s.dtype) if s.dtype not in ("string", "unknown") else np.float32
        feeds[s.name] = rng.standard_normal(shape).astype(dt) if np.issubdtype(dt, np.floating) \
            else rng.integers(0, 2, size=shape).astype(dt)
    return feeds


def measure_end_to_end(model, db_path: str, dims: dict | None = None, runs: int = 30) -> dict:
    """Median latency of the untuned and the tuned model, runs interleaved, outputs compared."""
    from kiln.compiler import compile  # noqa: PLC0415, A004
    base = compile(model, tuning="")
    tuned = compile(model, tuning=db_path)
    feeds = random_feeds(base, dims)
    want, got = base.run(feeds), tuned.run(feeds)
    close = all(np.allclose(np.asarray(got[k], dtype=float), np.asarray(want[k], dtype=float),
                            rtol=1e-3, atol=1e-3, equal_nan=True) for k in want
                if np.asarray(want[k]).dtype != object)
    times: dict[str, list] = {"untuned": [], "tuned": []}
    for _ in range(runs):
        for name, m in (("untuned", base), ("tuned", tuned)):
            t = time.perf_counter()
            m.run(feeds)
            times[name].append(time.perf_counter() - t)
    med = {k: float(np.median(v)) for k, v in times.items()}
    return {**med, "speedup": med["untuned"] / med["tuned"], "outputs_match": bool(close)}
