"""Decisions graph passes make per node, as tuning tasks: each conv's algorithm and layout
(the layout pass: kiln.lower.conv_algo), each constant GEMM weight's panel width (the
pack_weights pass: gemm.weight_nr).

A pass decides before the graph is partitioned, and its choice changes which kernels exist
(a Winograd conv, its layout conversions, what its neighbours run on; the packed weight's
shape): it cannot be searched kernel by kernel like a tile size. A candidate is the whole
model built with one node workload's decision changed ({"@conv:<hash>": {"conv.algorithm":
...}}, the per-node override the pass reads) and timed in the measuring worker in turn with
the model built by the rule, its outputs checked against the rule's. The spaces are tiny (at
most four values per workload, listed by the pass's finding: `options`), so they are
enumerated, the heaviest workload (most repeats) first. A record per candidate goes in the
database under the node's workload key; kiln.tune.apply.with_pass_records hands the best (by
MIN_GAIN, as for kernels) to the passes of `kiln.compile(..., tuning=db)`.

This module knows nothing of the compiler: `build(decisions)` (kiln.tuning) makes a
candidate's worker job.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from kiln.errors import KilnError

PREFIXES = ("conv:", "gemm:")     # the workload keys of per-node pass decisions (kiln.lower.workload.node_key)


@dataclass
class PassTask:
    key: str                       # the node's workload (kiln.lower.workload.node_key)
    decision: str                  # conv.algorithm, gemm.weight_nr
    default: object                # the value the pass's rule chose
    options: tuple                 # the values it can take
    weight: int = 1                # nodes of the model with this workload
    description: str = ""
    seconds: dict = field(default_factory=dict)   # value -> the model's time with it (this run)
    errors: dict = field(default_factory=dict)    # value -> why it was not measured
    stale_records: dict = field(default_factory=dict)   # kernel code version -> records of it (not applied)

    @property
    def candidates(self) -> list:
        return [a for a in self.options if a != self.default]

    @property
    def best(self):
        return min(self.seconds, key=self.seconds.get) if self.seconds else self.default


def pass_tasks(findings: list) -> list[PassTask]:
    """The node workloads with another value to try, from the passes' findings that are per-node
    choices (a `key` among PREFIXES, `decision`, `value`, `options`: kiln.lower.conv_algo.ConvChoice,
    kiln.passes.pack_weights.PanelChoice), heaviest first."""
    tasks: dict[str, PassTask] = {}
    for c in findings:
        key = getattr(c, "key", "")
        if not isinstance(key, str) or not key.startswith(PREFIXES) or not hasattr(c, "options"):
            continue
        if key in tasks:
            tasks[key].weight += 1
        else:
            tasks[key] = PassTask(key, c.decision, c.value, tuple(c.options), 1, str(c.shape))
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


def tune_pass_tasks(tasks: list[PassTask], build: Callable[[dict], dict], db, sig: str, worker, *,
                    deadline: float, repeats: int = 5, min_seconds: float = 0.05, clock: str = "wall",
                    on_progress: Callable[[PassTask], None] | None = None,
                    patience: int | None = None) -> list[PassTask]:
    """Measure each task's other values against the rule's (whole models, interleaved in
    `worker`: kiln.tune.measure.Worker) until `deadline` (time.perf_counter()), recording
    every measurement in `db` under `sig`. Candidates measured before under this signature are
    not measured again (a resumed run goes on). `build(decisions)`: the worker job of the
    model built with `decisions` ({"path", "symbol", "arrays", "n_in", "n_out"}) or a KilnError.

    `patience`: stop after that many tasks in a row measured in this run where no value beat
    the rule by MIN_GAIN. The heaviest workloads come first; where the rule was right on them,
    the rest of the budget serves the kernels better (resnext50 batch 4, --clock cpu, 10 min:
    40% of the budget confirmed the rule on 5 convs, each alternative 4-12% slower, while 17 of
    its 32 kernel tasks were never searched)."""
    from kiln.tune.records import MIN_GAIN  # noqa: PLC0415
    base = None
    stale = 0
    for task in tasks:
        if patience is not None and stale >= patience:
            return tasks
        db.add_workload(task.key, f"{task.decision}: {task.description}")
        task.stale_records = db.stale(task.key, sig)
        done = {r.decisions.get(task.decision) for r in db.records(task.key, sig, current=True) if not r.is_default}
        for alg in task.candidates:
            if alg in done:
                continue
            if time.perf_counter() > deadline:
                return tasks
            if base is None:
                base = build({})
            try:
                job = build({"@" + task.key: {task.decision: alg}})
            except KilnError as e:
                task.errors[alg] = f"build: {e}"
                db.add(task.key, sig, {task.decision: alg}, None, task.errors[alg])
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
                task.errors[alg] = "wrong output (differs from the rule's)"
            if alg in task.errors:
                db.add(task.key, sig, {task.decision: alg}, None, task.errors[alg])
                continue
            t, t0 = float(min(ans["times"])), float(min(ans["base_times"]))
            task.seconds.setdefault(task.default, t0)
            task.seconds[task.default] = min(task.seconds[task.default], t0)
            task.seconds[alg] = t
            db.add(task.key, sig, {task.decision: task.default}, t0, is_default=True)
            db.add(task.key, sig, {task.decision: alg}, t)
            if on_progress:
                on_progress(task)
        if task.seconds and set(task.seconds) | set(task.errors) >= set(task.options):   # measured whole
            rule = task.seconds.get(task.default)
            won = rule is not None and any(t < rule * (1 - MIN_GAIN) for a, t in task.seconds.items() if a != task.default)
            stale = 0 if won else stale + 1
    return tasks
