"""Tuned builds: the best record per workload for this machine, as decision overrides.

`kiln.compile(model, tuning="tuning.db")` (or $KILN_TUNING_DB) looks up, before a
specialised graph is lowered, the best record of each fusion group's workload
(kiln.lower.workload) measured under this machine's signature. They travel with the
other decision overrides as {"@<workload>": {decision: value, "#record": id}} entries
(so the module cache key includes them, and the build's manifest lists the records),
and lowering hands each kernel its own. Records of another machine signature are never
applied; those timed on one thread (`kiln tune --clock cpu`, signature suffix "-cpu1") only
where no record timed on the model's threads exists. Records measured on other kernel code
(kiln.tune.version: kiln changed since) are not applied either; a workload that has only
such records is built with its default schedule, with a warning that says how many. A
record that no longer fits the kernel (kiln changed its template) is ignored with a warning:
the default schedule is built.
"""

from __future__ import annotations

import os
import warnings

from kiln.errors import KilnError

ENV = "KILN_TUNING_DB"


def tuning_path(tuning) -> str | None:
    """The database asked for: the argument, else $KILN_TUNING_DB, else none ("" : none)."""
    path = (tuning if tuning is not None else os.environ.get(ENV)) or None   # "": no tuning
    if path is not None and not os.path.exists(path):
        raise KilnError(f"tuning database {path!r} does not exist (kiln tune writes one)")
    return None if path is None else os.fspath(path)


def with_pass_records(path: str | None, decisions: dict, target=None) -> dict:
    """`decisions` plus, per node workload with a record of a decision a graph pass makes
    (kiln.tune.pass_tasks: a conv's algorithm, a GEMM weight's panel width) for this machine, the
    best one, for the passes: {"@conv:<hash>": {"conv.algorithm": ..., "#record": id}} (none
    for another CPU than this one; asked by hand wins)."""
    if path is None:
        return decisions
    from kiln.tune.pass_tasks import PREFIXES  # noqa: PLC0415
    from kiln.tune.records import Database  # noqa: PLC0415
    from kiln.tune.signature import machine, signature  # noqa: PLC0415
    if target is not None and target.key() != machine()["target"]:
        return decisions
    found: dict = {}
    stale: dict = {}
    with Database(path) as db:
        for sig in (signature(clock="cpu"), signature()):    # timed on the model's threads wins
            for key in (k for p in PREFIXES for k in db.workloads(p, sig)):
                best = db.best(key, sig)
                if best is not None:
                    found["@" + key] = None if best.is_default else {**best.decisions, "#record": best.id}
        for sig in (signature(clock="cpu"), signature()):    # (workloads with no record applied)
            for key in (k for p in PREFIXES for k in db.workloads(p, sig, current=False) if "@" + k not in found):
                _add_stale(stale, db.stale(key, sig))
    _warn_stale(path, stale, "graph pass decisions")
    return {**{k: v for k, v in found.items() if v is not None}, **decisions}   # asked by hand wins


def with_records(path: str | None, graph, known: dict, decisions: dict, target=None) -> dict:
    """`decisions` plus, per workload of `graph` with a record for this machine, the best one
    (none when the code is built for another CPU than this one: `target`)."""
    if path is None:
        return decisions
    from kiln.lower.module import group_keys  # noqa: PLC0415 (kiln.lower only when tuning)
    from kiln.tune.records import Database  # noqa: PLC0415
    from kiln.tune.signature import machine, signature  # noqa: PLC0415
    if target is not None and target.key() != machine()["target"]:
        return decisions
    sigs = (signature(), signature(clock="cpu"))   # timed on the model's threads first, else on one
    out = dict(decisions)
    stale: dict = {}
    with Database(path) as db:
        for key in dict.fromkeys(group_keys(graph, known)):
            best = next((b for b in (db.best(key, s) for s in sigs) if b is not None), None)
            if best is None:
                for s in sigs:
                    _add_stale(stale, db.stale(key, s))
            elif not best.is_default:
                out["@" + key] = {**best.decisions, "#record": best.id}
    _warn_stale(path, stale, "this model's kernels")
    return out


def _add_stale(into: dict, counts: dict) -> None:
    for v, n in counts.items():
        into[v] = into.get(v, 0) + n


def _warn_stale(path: str, stale: dict, what: str) -> None:
    """Say that records of other kernel code were not applied (a default schedule was built
    where the database has only such records), and why."""
    if stale:
        from kiln.tune.version import stale_reason  # noqa: PLC0415
        warnings.warn(f"{sum(stale.values())} tuning records for {what} in {path!r} were not "
                      "applied: " + "; ".join(f"{n} {stale_reason(v)}" for v, n in stale.items())
                      + "; the default schedules were built (`kiln tune` again measures this code)", stacklevel=3)
