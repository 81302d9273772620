"""`kiln tune`: a time budget spread over a model's tasks, rounds of search, the final table.

Each task starts from its records on this machine (a run that was interrupted goes on
where it stopped) and from its default schedule's time, measured once. The budget goes
round by round to the task whose share of the time spent so far lags its share of the
model's time (repeats x default time), lowered while its rounds stop improving, so a
layer that repeats twelve times and has room to gain is tuned first. Every measurement
is a record as soon as it is made: Ctrl-C loses at most the batch being measured.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from kiln.errors import KilnError
from kiln.tune.costmodel import CostModel, kendall_tau
from kiln.tune.features import featurize
from kiln.tune.measure import THREAD_DECISIONS, Measurer, Result
from kiln.tune.records import Database
from kiln.tune.search import Search
from kiln.tune.signature import machine, signature
from kiln.tune.tasks import Task, tasks_of

ILLEGAL = re.compile(r"illegal value (.+?) for decision '([^']+)'")   # lowering's KilnError for a value


@dataclass
class TaskState:
    task: Task
    search: Search
    default_s: float | None = None
    best_s: float | None = None
    best: dict | None = None
    trials: int = 0            # measured in this run
    failures: int = 0
    spent: float = 0.0         # seconds of this run's budget
    stale: int = 0             # rounds in a row without a better time
    reused: int = 0            # candidates that were the same code as one measured before
    texts: dict = field(default_factory=dict)   # kernel code -> its best time in this run
    done: bool = False
    note: str = ""
    confirmed: bool = False    # best_s is the database's confirmed best (Tuner.confirm)
    rechecks: int = 0          # rounds of measuring the leaders again (each with the default)
    stale_records: dict = field(default_factory=dict)   # kernel code version -> this machine's records
                                                        # measured on it (not applied; seeds only)

    @property
    def speedup(self) -> float:
        return self.default_s / self.best_s if self.default_s and self.best_s else 1.0

    @property
    def share(self) -> float:
        """What the task weighs in the model's time, discounted while it stops improving."""
        return self.task.weight * (self.default_s or 0.0) * (0.6 ** self.stale)


@dataclass
class TuneReport:
    tasks: list[TaskState]
    signature: str
    seconds: float
    taus: list[float] = field(default_factory=list)    # per round: predicted vs measured order
    interrupted: bool = False
    end_to_end: dict | None = None                      # untuned / tuned model medians
    passes: list = field(default_factory=list)          # graph pass decisions' tasks (kiln.tune.pass_tasks)

    @property
    def estimated_speedup(self) -> float:
        before = sum(s.task.weight * s.default_s for s in self.tasks if s.default_s)
        after = sum(s.task.weight * (s.best_s or s.default_s) for s in self.tasks if s.default_s)
        return before / after if after else 1.0

    @property
    def stale_records(self) -> dict:
        """Records of this machine skipped as stale (measured on other kernel code), by version."""
        out: dict = {}
        for s in [*self.tasks, *self.passes]:
            for v, n in s.stale_records.items():
                out[v] = out.get(v, 0) + n
        return out

    @property
    def mean_tau(self) -> float:
        vals = [t for t in self.taus if not math.isnan(t)]
        return float(np.mean(vals)) if vals else float("nan")


class Tuner:
    def __init__(self, db_path: str, trials_per_round: int = 8, n_random: int = 2, timeout: float = 60.0,
                 repeats: int = 5, min_seconds: float = 0.005, seed: int = 0, measurer=None, clock: str = "wall"):
        self.db = Database(db_path)
        self.db_path = db_path
        self.measurer = measurer or Measurer(timeout=timeout, repeats=repeats, min_seconds=min_seconds,
                                             featurize=featurize, clock=clock)
        self.clock = getattr(self.measurer, "clock", clock)
        self.sig = signature(clock=self.clock)
        self.db.add_machine(self.sig, {**machine(), "clock": self.clock})
        self.model = CostModel(seed=seed)
        self.trials_per_round, self.n_random, self.seed = trials_per_round, n_random, seed
        self.X: list[np.ndarray] = []
        self.y: list[float] = []

    def close(self) -> None:
        self.measurer.close()
        self.db.close()

    # -- one task ---------------------------------------------------------------------
    def _features(self, task: Task, decisions: dict):
        r = self.measurer.lower(task, decisions)
        return r.features if r.error is None else None

    def space(self, task: Task) -> dict:
        """The decisions this run searches: all of the task's, less the thread decisions on
        the one-thread "cpu" clock (they keep their defaults)."""
        if self.clock != "cpu":
            return task.space
        return {k: v for k, v in task.space.items() if k not in THREAD_DECISIONS}

    def start(self, task: Task) -> TaskState:
        """The task's state from its records (this machine's; other machines' seed the search)."""
        self.db.add_workload(task.key, task.description)
        space = self.space(task)
        search = Search(space, lambda d, t=task: self._features(t, d), self.model,
                        seed=self.seed + int(task.key[:8], 16))
        st = TaskState(task, search, stale_records=self.db.stale(task.key, self.sig))
        if all(len(v) <= 1 for v in space.values()):
            st.done, st.note = True, "thread decisions only (--clock wall tunes them)"
            return st
        # other machines' records and this machine's stale ones (other kernel code) seed the search
        others = [r for r in self.db.records(task.key)
                  if r.ok and (r.signature != self.sig or r.version != self.db.version)]
        search.seeds = [{k: v for k, v in r.decisions.items() if k in space}
                        for r in sorted(others, key=lambda r: r.seconds)[:4] if set(r.decisions) <= set(task.space)]
        mine = self.db.records(task.key, self.sig, current=True)
        st.default_s = self.db.default_seconds(task.key, self.sig)
        if st.default_s is None:
            res = self._measure(st, [dict(task.defaults)], default=True)[0]
            if res.seconds is None:
                st.done, st.note = True, f"default schedule not measurable: {res.error}"
                return st
            st.default_s = res.seconds
        for r in mine:
            search.tell(self._searched(st, r.decisions), r.seconds)
        for r in mine[-200:]:   # resumed: the model learns from what earlier runs measured
            if r.ok and not r.is_default:
                f = self._features(task, r.decisions)
                if f is not None:
                    self.X.append(f)
                    self.y.append(math.log(st.default_s / r.seconds))
        found = search.best()
        if found is not None:
            st.best, st.best_s = found
        return st

    @staticmethod
    def _prune(st: TaskState, error: str | None) -> None:
        """A value this kernel cannot take (lowering's KilnError names it: "illegal value V for
        decision 'D'") leaves the task's space, so the search does not spend trials on it again."""
        m = ILLEGAL.search(error or "")
        vals = st.search.space.get(m.group(2)) if m else None
        if vals and len(vals) > 1:
            keep = [v for v in vals if repr(v) != m.group(1)]
            if keep and keep[0] == vals[0]:   # the default stays (it is legal: it was measured)
                st.search.space[m.group(2)] = keep

    @staticmethod
    def _searched(st: TaskState, decisions: dict) -> dict:
        """`decisions` restricted to what this run searches (a record may hold more)."""
        return {k: v for k, v in decisions.items() if k in st.search.space}

    def _measure(self, st: TaskState, cands: list[dict], default: bool = False, again: bool = False) -> list[Result]:
        """Lower, build and time candidates, and record them. A candidate whose kernel is the
        same code as one measured before (decisions that make no difference here) takes that
        time instead of a measurement; the default is always measured again (its best time,
        over the run, is the baseline: a baseline taken once at a busy moment would make
        every later candidate look faster than it is)."""
        lowered = [self.measurer.lower(st.task, c) for c in cands]
        fresh = [r for r in lowered if default or again or r.func is None or str(r.func) not in st.texts]
        self.measurer.measure(st.task, fresh)
        for r in fresh:   # timed in turn with the default: its ratio, in units of the default's best time
            if not default and r.ratio is not None and st.default_s:
                r.seconds = r.ratio * st.default_s
        measured = {id(r) for r in fresh}
        for r in lowered:
            text = None if r.func is None else str(r.func)
            if id(r) in measured:
                if text is not None and r.seconds is not None:
                    old = st.texts.get(text)
                    st.texts[text] = r.seconds if old is None else min(old, r.seconds)
            else:
                r.seconds = st.texts[text]
                r.error = None if r.seconds is not None else "same kernel as a failed candidate"
                st.reused += 1
            self.db.add(st.task.key, self.sig, r.taken or r.decisions, r.seconds,
                        None if r.seconds is not None else (r.error or "not measured"), is_default=default)
            st.search.tell(self._searched(st, r.decisions), r.seconds)
            if r.taken is not None and set(r.taken) == set(st.task.space):
                st.search.tell(self._searched(st, r.taken), r.seconds)
            if r.seconds is None:
                st.failures += 1
                self._prune(st, r.error)
        if default:
            best = self.db.default_seconds(st.task.key, self.sig)
            st.default_s = best if best is not None else st.default_s
        return fresh

    def round(self, st: TaskState) -> float:
        """One round of search on a task; returns Kendall's tau of the model on the new batch."""
        cands = st.search.propose(self.trials_per_round, self.n_random)
        if not cands:
            st.done, st.note = True, "space exhausted"
            return float("nan")
        t0 = time.perf_counter()
        self._measure(st, [dict(st.task.defaults)], default=True)   # the baseline, again
        results = self._measure(st, cands)
        st.trials += len(results)
        ok = [r for r in results if r.seconds is not None and r.features is not None]
        tau = float("nan")
        if self.model.trained and len(ok) >= 3:   # predicted before these were seen: held out
            pred = self.model.predict(np.stack([r.features for r in ok]))
            tau = kendall_tau(pred, [-r.seconds for r in ok])
        for r in ok:
            self.X.append(r.features)
            self.y.append(math.log(st.default_s / r.seconds))
        if self.X:
            self.model.fit(np.stack(self.X), np.array(self.y))
        found = st.search.best()
        if found is not None and (st.best_s is None or found[1] < st.best_s * 0.995):
            st.best, st.best_s = found
            st.stale = 0
        else:
            st.stale += 1
        st.spent += time.perf_counter() - t0
        return tau


    def confirm(self, st: TaskState, rounds: int = 3, top: int = 3) -> None:
        """Measure the leaders measured only once again, until the best configuration (the
        database's ranking: a candidate scores its slowest measurement) was measured at least
        twice: the fastest of many noisy measurements is too fast by luck (the winner's
        curse), and a record applied to every build of the model should not rest on one."""
        for _ in range(rounds):
            lead = self.db.ranking(st.task.key, self.sig, top)
            if not lead or lead[0][0].is_default or lead[0][1] >= 2:
                break
            again = [r.decisions for r, n in lead if n < 2 and not r.is_default]
            self._measure(st, [dict(st.task.defaults)], default=True)
            self._measure(st, again, again=True)
            st.rechecks += 1
        best = self.db.best(st.task.key, self.sig)
        if best is not None:
            st.best, st.best_s = (None, st.default_s) if best.is_default else (best.decisions, best.seconds)
            st.confirmed = True


def _pick(states: list[TaskState]) -> TaskState | None:
    live = [s for s in states if not s.done]
    if not live:
        return None
    total_share = sum(s.share for s in live) or 1.0
    total_spent = sum(s.spent for s in live) + 1e-9
    # the task whose share of the time spent lags its share of the model's time the most
    return max(live, key=lambda s: s.share / total_share - s.spent / total_spent)


CONFIRM_SHARE = 0.08   # of the budget, kept for measuring the leaders again (Tuner.confirm)


def tune(graph, known: dict, db_path: str, budget_s: float, *, trials_per_round: int = 8, n_random: int = 2,
         timeout: float = 60.0, seed: int = 0, on_progress: Callable[[TuneReport, float], None] | None = None,
         measurer=None, clock: str = "wall") -> TuneReport:
    """Tune the kernels of a specialised graph for `budget_s` seconds into the database `db_path`
    (kiln.tuning.tune_model does it for a model, and measures it end to end). `clock`: "wall"
    (the model's threads, for a quiet machine) or "cpu" (one thread, thread CPU time: for a
    loaded one; kiln.tune.measure)."""
    t0 = time.perf_counter()
    tasks = tasks_of(graph, known)
    if not tasks:
        raise KilnError("this model has no kernel with schedule decisions to tune")
    tuner = Tuner(db_path, trials_per_round, n_random, timeout, seed=seed, measurer=measurer, clock=clock)
    report = TuneReport([], tuner.sig, 0.0)
    try:
        for task in tasks:
            report.tasks.append(tuner.start(task))
            if on_progress:
                on_progress(report, time.perf_counter() - t0)
            if time.perf_counter() - t0 > budget_s:
                break
        while time.perf_counter() - t0 < budget_s * (1 - CONFIRM_SHARE):
            st = _pick(report.tasks)
            if st is None:
                break
            report.taus.append(tuner.round(st))
            if on_progress:
                on_progress(report, time.perf_counter() - t0)
        for st in sorted(report.tasks, key=lambda s: -s.share):
            if st.default_s:
                tuner.confirm(st)
        if on_progress:
            on_progress(report, time.perf_counter() - t0)
    except KeyboardInterrupt:
        report.interrupted = True
    finally:
        tuner.close()
    report.seconds = time.perf_counter() - t0
    return report
