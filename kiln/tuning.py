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


def specialized_graph(model, dims: dict | None = None, opt_level: int | None = None, decisions: dict | None = None,
                      findings: list | None = None):
    """The model's graph as kiln would lower it (specialised to `dims` for symbolic inputs), with
    the decision overrides the passes read (`decisions`: the per-conv algorithms); the passes'
    findings (each conv's algorithm) appended to `findings`."""
    from kiln.compiler import frontend, optimize, spec_of, specialize  # noqa: PLC0415
    from kiln.runtime.inputs import bind_dims, concrete_shape  # noqa: PLC0415
    if opt_level is None:
        from kiln.passes.pipeline import DEFAULT_LEVEL  # noqa: PLC0415
        opt_level = DEFAULT_LEVEL
    from kiln.targets.target import Target  # noqa: PLC0415
    opt = optimize(frontend(model), opt_level, Target.host(), decisions)
    ins = [spec_of(v) for v in opt.graph.inputs]
    bound = bind_dims(ins, {}, dict(dims or {}))
    spec = specialize(opt, [concrete_shape(s, bound) for s in ins])
    if spec.breaks:
        raise KilnError("this model runs in stages (data-dependent shapes); kiln tune handles models "
                        "that are one native module: " + "; ".join(str(b) for b in spec.breaks))
    if findings is not None:   # (passes that ran again at these shapes decided what is built)
        findings.extend(f for p in (spec.stats if opt.source is not None else opt.stats) for f in p.findings)
    return spec.graph, spec.known


def module_job(model, dims: dict | None, decisions: dict) -> dict:
    """The measuring worker's job for the whole model built with `decisions` (kiln.tune.worker:
    its entry over fresh random inputs, its outputs, its weights and its workspace)."""
    from kiln.compiler import native  # noqa: PLC0415
    from kiln.targets.target import Target  # noqa: PLC0415
    graph, known = specialized_graph(model, dims, decisions=decisions)
    mod = native(graph, known, Target.host(), decisions)
    if not mod._plain:
        raise KilnError("kiln tune times conv algorithms on models with numeric inputs and outputs only")
    rng = np.random.default_rng(0)
    ins = []
    for v in graph.inputs:
        dt = v.type.dtype.np
        shape = tuple(v.type.shape)
        ins.append(rng.standard_normal(shape).astype(dt) if np.issubdtype(dt, np.floating)
                   else rng.integers(0, 2, size=shape).astype(dt))
    outs = [np.empty(shape, dt) for shape, dt in mod.output_types]
    return {"path": mod.library_path, "symbol": mod.info["entry"], "n_in": len(ins), "n_out": len(outs),
            "arrays": ins + outs + [mod.weights, np.zeros(max(mod.workspace_bytes, 64), np.uint8)]}


PASS_SHARE = 0.4   # of the budget at most, for the passes' decisions (whole models: each candidate a build)
PASS_PATIENCE = 3  # pass tasks in a row where the rule won before the rest goes to the kernels (tune_pass_tasks)


def tune_pass_decisions(model, db_path: str, budget_s: float, *, dims: dict | None = None, clock: str = "wall",
                        timeout: float = 60.0, on_progress=None, patience: int | None = None) -> list:
    """Each node workload's other values of the decisions graph passes make (a conv's algorithm,
    a GEMM weight's panel width) tried on the whole model for up to `budget_s`
    (kiln.tune.pass_tasks); returns its PassTasks."""
    from kiln.tune.measure import Worker  # noqa: PLC0415
    from kiln.tune.pass_tasks import pass_tasks, tune_pass_tasks  # noqa: PLC0415
    from kiln.tune.records import Database  # noqa: PLC0415
    from kiln.tune.signature import machine, signature  # noqa: PLC0415
    t0 = time.perf_counter()
    found: list = []
    specialized_graph(model, dims, findings=found)
    tasks = pass_tasks(found)
    if not tasks:
        return []
    sig = signature(clock=clock)
    worker = Worker(timeout, threads=1 if clock == "cpu" else None)
    with Database(db_path) as db:
        db.add_machine(sig, {**machine(), "clock": clock})
        try:
            return tune_pass_tasks(tasks, lambda d: module_job(model, dims, d), db, sig, worker,
                                   deadline=t0 + budget_s, clock=clock, on_progress=on_progress, patience=patience)
        finally:
            worker.close()


def extract_tasks(model, dims: dict | None = None) -> list[Task]:
    """A model's tuning tasks (kiln.tune.tasks), for the shapes `dims` binds."""
    graph, known = specialized_graph(model, dims)
    return tasks_of(graph, known)


def tune_model(model, db_path: str, budget_s: float, *, dims: dict | None = None, end_to_end: bool = True,
               pass_share: float = PASS_SHARE, **options) -> TuneReport:
    """Tune `model` for `budget_s` seconds into `db_path`: first (up to `pass_share` of the
    budget) the decisions graph passes make per node (each conv's algorithm, each GEMM weight's
    panel width) on the whole model, then the kernels of the model built with the values found (options: kiln.tune.tuner.tune's); then, unless interrupted, time it
    untuned and tuned (`report.end_to_end`)."""
    t0 = time.perf_counter()
    passes = []
    if pass_share > 0 and options.get("measurer") is None:   # (on this machine: builds are local)
        try:
            passes = tune_pass_decisions(model, db_path, budget_s * pass_share, dims=dims,
                                         clock=options.get("clock", "wall"), timeout=options.get("timeout", 60.0),
                                         patience=PASS_PATIENCE)
        except KeyboardInterrupt:   # what was measured is in the database: run again to go on
            from kiln.tune.signature import signature  # noqa: PLC0415
            return TuneReport([], signature(clock=options.get("clock", "wall")), time.perf_counter() - t0,
                              interrupted=True)
    from kiln.targets.target import Target  # noqa: PLC0415
    from kiln.tune.apply import with_pass_records  # noqa: PLC0415
    graph, known = specialized_graph(model, dims, decisions=with_pass_records(db_path, {}, Target.host()))
    report = tune(graph, known, db_path, max(budget_s - (time.perf_counter() - t0), 1.0), **options)
    report.passes = passes
    if end_to_end and not report.interrupted:
        report.end_to_end = measure_end_to_end(model, db_path, dims, clock=options.get("clock", "wall"))
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


def measure_end_to_end(model, db_path: str, dims: dict | None = None, runs: int = 30, clock: str = "wall") -> dict:
    """Median latency of the untuned and the tuned model, runs interleaved, outputs compared;
    clock "cpu": in a child process on one thread, by its thread CPU time (for a loaded machine;
    the child calls this with "thread": this process's thread CPU time)."""
    if clock == "cpu":
        return _end_to_end_one_thread(model, db_path, dims, runs)
    from kiln.compiler import compile  # noqa: PLC0415, A004
    base = compile(model, tuning="", tier="full")   # (timed: the -O3 builds, kiln.codegen.tiers)
    tuned = compile(model, tuning=db_path, tier="full")
    feeds = random_feeds(base, dims)
    want, got = base.run(feeds), tuned.run(feeds)
    close = all(np.allclose(np.asarray(got[k], dtype=float), np.asarray(want[k], dtype=float),
                            rtol=1e-3, atol=1e-3, equal_nan=True) for k in want
                if np.asarray(want[k]).dtype != object)
    clock = time.thread_time if clock == "thread" else time.perf_counter
    times: dict[str, list] = {"untuned": [], "tuned": []}
    end = time.perf_counter() + 1.0   # at least `runs` each, and a second of them
    while len(times["tuned"]) < runs or time.perf_counter() < end:
        for name, m in (("untuned", base), ("tuned", tuned)):
            t = clock()
            m.run(feeds)
            times[name].append(clock() - t)
    med = {k: float(np.median(v)) for k, v in times.items()}
    return {**med, "speedup": med["untuned"] / med["tuned"], "outputs_match": bool(close),
            "runs": len(times["tuned"]), "clock": "cpu" if clock is time.thread_time else "wall"}


def _end_to_end_one_thread(model, db_path: str, dims: dict | None, runs: int) -> dict:
    """measure_end_to_end in a child process with one OpenMP thread, timed by thread CPU time."""
    import json  # noqa: PLC0415
    import os  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415
    import tempfile  # noqa: PLC0415
    with tempfile.TemporaryDirectory(prefix="kiln-e2e-") as tmp:
        path = model
        if not isinstance(model, (str, os.PathLike)):   # a ModelProto: the child reads a file
            import onnx  # noqa: PLC0415
            path = os.path.join(tmp, "model.onnx")
            onnx.save(model, path)
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ, OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
        code = ("import json, sys; from kiln.tuning import measure_end_to_end as m; "
                "a = json.loads(sys.argv[1]); print(json.dumps(m(a['model'], a['db'], a['dims'], a['runs'], 'thread')))")
        arg = json.dumps({"model": os.fspath(path), "db": db_path, "dims": dims, "runs": runs})
        p = subprocess.run([sys.executable, "-c", code, arg], env=env, capture_output=True, text=True)
        if p.returncode != 0:
            raise KilnError(f"the one-thread end-to-end measurement failed: {p.stderr.strip()[-2000:]}")
        return json.loads(p.stdout.strip().splitlines()[-1])
