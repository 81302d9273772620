"""The conv algorithm as a tuning task: per conv workload, which algorithm and layout runs it.

The layout pass picks each conv's algorithm (direct on NCHW, direct on the blocked layout,
Winograd: kiln.lower.conv_algo.choose) before the graph is partitioned, and its choice
changes which kernels exist, the layout conversions around them and what its neighbours
run on. So it cannot be searched kernel by kernel like a tile size: a candidate is the whole
model built with one conv workload's algorithm changed ({"@conv:<hash>": {"conv.algorithm":
...}}, the per-conv decision the layout pass reads) and timed in the measuring worker in turn
with the model built by the rule, its outputs checked against the rule's. The space is tiny
(at most three values per workload: kiln.lower.conv_algo.legal), so it is enumerated, the
heaviest workload (most repeats) first. A record per candidate goes in the database under the
conv's workload key; kiln.tune.apply.with_conv_records hands the best (by MIN_GAIN, as for
kernels) to the layout pass of `kiln.compile(..., tuning=db)`.

This module knows nothing of the compiler: `build(decisions)` (kiln.tuning) makes a
candidate's worker job.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from kiln.errors import KilnError

DECISION = "conv.algorithm"


@dataclass
class ConvTask:
    key: str                       # kiln.lower.conv_algo.conv_key
    default: str                   # the algorithm the rule (and the neighbour rule) chose
    options: tuple                 # the algorithms it can take (kiln.lower.conv_algo.legal)
    weight: int = 1                # convs of the model with this workload
    description: str = ""
    seconds: dict = field(default_factory=dict)   # algorithm -> the model's time with it (this run)
    errors: dict = field(default_factory=dict)    # algorithm -> why it was not measured

    @property
    def candidates(self) -> list[str]:
        return [a for a in self.options if a != self.default]

    @property
    def best(self) -> str:
        return min(self.seconds, key=self.seconds.get) if self.seconds else self.default


def conv_tasks(choices: list) -> list[ConvTask]:
    """The conv workloads with another algorithm to try, from the layout pass's ConvChoices
    (kiln.lower.conv_algo), heaviest first."""
    tasks: dict[str, ConvTask] = {}
    for c in choices:
        if not getattr(c, "key", ""):
            continue
        if c.key in tasks:
            tasks[c.key].weight += 1
        else:
            tasks[c.key] = ConvTask(c.key, c.choice.algorithm, tuple(c.options), 1, str(c.shape))
    return sorted((t for t in tasks.values() if t.candidates), key=lambda t: -t.weight)


def close(got: list, want: list, rtol: float = 1e-3, atol: float = 1e-4) -> bool:
    """Outputs equal to the rule's within the tolerance, relative to each output's largest value
    (Winograd's error grows with a deep model's activations: kiln.ops.winograd's bound)."""
    for g, w in zip(got, want):
        g, w = np.asarray(g, dtype=np.float64), np.asarray(w, dtype=np.float64)
        if g.shape != w.shape:
            return False
        if g.size and not np.all(np.abs(g - w) <= atol + rtol * max(float(np.max(np.abs(w))), 1.0)):
            return False
    return True


def tune_convs(tasks: list[ConvTask], build: Callable[[dict], dict], db, sig: str, worker, *,
               deadline: float, repeats: int = 5, min_seconds: float = 0.05, clock: str = "wall",
               on_progress: Callable[[ConvTask], None] | None = None) -> list[ConvTask]:
    """Measure each task's other algorithms against the rule's (whole models, interleaved in
    `worker`: kiln.tune.measure.Worker) until `deadline` (time.perf_counter()), recording
    every measurement in `db` under `sig`. Candidates measured before under this signature are
    not measured again (a resumed run goes on). `build(decisions)`: the worker job of the
    model built with `decisions` ({"path", "symbol", "arrays", "n_in", "n_out"}) or a KilnError."""
    base = None
    for task in tasks:
        db.add_workload(task.key, f"conv algorithm: {task.description}")
        done = {r.decisions.get(DECISION) for r in db.records(task.key, sig) if not r.is_default}
        for alg in task.candidates:
            if alg in done:
                continue
            if time.perf_counter() > deadline:
                return tasks
            if base is None:
                base = build({})
            try:
                job = build({"@" + task.key: {DECISION: alg}})
            except KilnError as e:
                task.errors[alg] = f"build: {e}"
                db.add(task.key, sig, {DECISION: alg}, None, task.errors[alg])
                continue
            ans = worker.run({**job, "repeats": repeats, "min_seconds": min_seconds, "clock": clock,
                              "base": {"path": base["path"], "symbol": base["symbol"], "arrays": base["arrays"]}})
            if "error" not in ans and "want" not in base:
                ref = worker.run({**base, "repeats": 1, "min_seconds": 0.0, "number": 1, "clock": clock})
                if "error" in ref:
                    raise KilnError(f"the model as the rule builds it did not run: {ref['error']}")
                base["want"] = ref["outputs"]
            if "error" in ans:
                task.errors[alg] = ans["error"]
            elif not close(ans["outputs"], base["want"]):
                task.errors[alg] = "wrong output (differs from the rule's algorithm's)"
            if alg in task.errors:
                db.add(task.key, sig, {DECISION: alg}, None, task.errors[alg])
                continue
            t, t0 = float(min(ans["times"])), float(min(ans["base_times"]))
            task.seconds.setdefault(task.default, t0)
            task.seconds[task.default] = min(task.seconds[task.default], t0)
            task.seconds[alg] = t
            db.add(task.key, sig, {DECISION: task.default}, t0, is_default=True)
            db.add(task.key, sig, {DECISION: alg}, t)
            if on_progress:
                on_progress(task)
    return tasks
