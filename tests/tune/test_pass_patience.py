"""The pass phase's patience (kiln.tune.pass_tasks.tune_pass_tasks): after `patience` node
workloads in a row where the rule's value won, the rest of the budget goes to the kernels; a
workload where another value won by MIN_GAIN starts the count again. Whole models are faked
here: `build` names the decisions, the worker times them from a table."""

from __future__ import annotations

import time

from kiln.tune.pass_tasks import PassTask, tune_pass_tasks
from kiln.tune.records import MIN_GAIN, Database


class FakeWorker:
    """Times a job from `table` (decision value -> seconds), the rule's model at 1.0 s."""

    def __init__(self, table: dict):
        self.table, self.jobs = table, []

    def run(self, job: dict) -> dict:
        self.jobs.append(job["name"])
        out = {"outputs": [0.0]}
        if "base" in job:
            out.update(times=[self.table.get(job["name"], 1.0)], base_times=[1.0])
        return out


def build(decisions: dict) -> dict:
    name = next((f"{k}={v}" for k, d in decisions.items() for v in d.values()), "rule")
    return {"path": "-", "symbol": "-", "arrays": [], "n_in": 0, "n_out": 1, "name": name}


def tasks(n: int) -> list[PassTask]:
    return [PassTask(f"conv:{i:02d}", "conv.algorithm", "a", ("a", "b", "c"), n - i) for i in range(n)]


def run(table: dict, patience, tmp_path) -> tuple[list[PassTask], FakeWorker]:
    worker = FakeWorker(table)
    with Database(tmp_path / f"t{len(list(tmp_path.iterdir()))}.db") as db:
        got = tune_pass_tasks(tasks(6), build, db, "sig", worker, deadline=time.perf_counter() + 60,
                              patience=patience)
    return got, worker


def test_it_stops_after_the_rule_wins_that_many_workloads_in_a_row(tmp_path):
    slower = {f"@conv:{i:02d}=b": 1.1 for i in range(6)}
    got, _ = run(slower, 2, tmp_path)
    assert [bool(t.seconds) for t in got] == [True, True, False, False, False, False]
    got, _ = run(slower, None, tmp_path)   # no patience: every workload measured
    assert all(set(t.seconds) == {"a", "b", "c"} for t in got)


def test_a_win_starts_the_count_again(tmp_path):
    table = {"@conv:01=c": 1.0 - 2 * MIN_GAIN,      # the second workload's "c" wins
             "@conv:03=b": 1.0 - MIN_GAIN / 2}      # less than MIN_GAIN: no win
    got, worker = run(table, 2, tmp_path)
    assert [bool(t.seconds) for t in got] == [True, True, True, True, False, False]
    assert got[1].best == "c" and got[3].best == "b"
    assert "@conv:04=b" not in worker.jobs
