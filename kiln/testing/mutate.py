"""Mutation fuzzing: valid models and artifacts, broken on purpose, must fail cleanly.

An ONNX file or a `.kiln` artifact is untrusted input. This harness takes valid
seeds and breaks them the ways an attacker (or a buggy exporter) would:

- models: attribute values (edge and huge ints, NaN/inf floats, wrong types,
  dropped or invented attributes), declared input dims and dtypes, initializer
  dims, dtypes, values and bytes, op types swapped, inputs dropped, renamed or
  added, outputs dropped, domains and opsets changed, names with control
  characters, and the run-time input arrays (extreme values, other shapes and
  dtypes);
- artifacts: manifest fields (deleted, retyped, edge values), members
  truncated, garbled, dropped or added, and the zip itself cut.

Each case runs in a sandboxed subprocess (kiln.testing.sandbox: time and memory
limits) that imports the model, compiles it (target cpu or interpreter) and
runs it, or loads and runs the artifact. The outcome must be `ok` or a
`KilnError`; an other exception, a crash (signal) or a hang fails.

    kiln fuzz-mutate --models 200 --artifacts 50 --seed 0      # a quick budget
    kiln fuzz-mutate --hours 4 --corpus all --out fuzz-out      # a long run

Seed corpora: `builtin` (23 small models over the ops an attacker aims at), `onnx`
(the ~1,900 ONNX backend node models), `generated` (100 random valid graphs of the
differential fuzzer, kiln.testing.fuzz_graphs), `all` (the three).

The seeds are kiln.testing.mutate_seeds, the mutations kiln.testing.mutate_inputs; this
module runs the cases and the campaigns.

Failing cases are written to `--out` (the mutated .onnx or .kiln plus a JSON
line saying which seed, which mutations and what happened), so each one can be
replayed with `kiln run`.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from kiln.testing.sandbox import OUTCOMES, Outcome, Sandbox
from kiln.testing.mutate_seeds import builtin_seeds, seeds_for
from kiln.testing.mutate_inputs import mutate_artifact, mutate_model


# ---------------------------------------------------------------- running a case (in the sandbox)

def run_case(case: dict) -> None:
    """The sandbox worker's job for one case: import, compile and run a model, or load and
    run an artifact. Raises whatever kiln raises; the sandbox classifies it."""
    import kiln
    if case["kind"] == "artifact":
        model = kiln.load(case["path"])
    else:
        model = kiln.compile(case["model"], target=case["target"], opt_level=case.get("opt_level", 2))
    model.run(_feeds_for(model, case.get("feeds") or {}, case.get("seed", 0)))


def _feeds_for(model, given: dict, seed: int) -> dict:
    """The case's arrays for the inputs they name (as given: the model must check them);
    seeded random values (symbols sized 2) for the rest."""
    from kiln.runtime.inputs import random_inputs, symbols
    names = {s.name for s in model.inputs}
    given = {k: v for k, v in given.items() if k in names}
    missing = [s for s in model.inputs if s.name not in given]
    if missing:
        dims = {d: 2 for d in symbols(missing)}
        try:
            given = {**random_inputs(missing, dims, seed, given={}), **given}
        except Exception:  # noqa: BLE001 - a spec the harness cannot fill (sequence, unknown shape):
            given.update({s.name: np.zeros((), np.float32) for s in missing})  # the model must refuse it
    return given


# ---------------------------------------------------------------- campaigns

@dataclass
class Report:
    counts: Counter = field(default_factory=Counter)     # (kind "model"/"artifact", outcome) -> n
    failures: list[dict] = field(default_factory=list)   # one per failing case
    seconds: float = 0.0
    wrapped: Counter = field(default_factory=Counter)    # KilnErrors wrapping another exception, by type

    def total(self, kind: str) -> int:
        return sum(n for (k, _), n in self.counts.items() if k == kind)

    def failed(self) -> int:
        return len(self.failures)

    def __str__(self) -> str:
        lines = []
        for kind in ("model", "artifact"):
            n = self.total(kind)
            if n:
                parts = ", ".join(f"{o} {self.counts[(kind, o)]}" for o in OUTCOMES)
                lines.append(f"{n} mutated {kind}s: {parts}")
        if self.wrapped:
            lines.append("KilnErrors wrapping an internal exception (the op's code failed, not a check): "
                         + ", ".join(f"{k} {n}" for k, n in self.wrapped.most_common()))
        lines.append(f"{self.failed()} failing case(s) in {self.seconds:.0f} s")
        for f in self.failures[:20]:
            detail = f["detail"].strip().splitlines()
            lines.append(f"  [{f['outcome']}] {f['seed']} <- {'; '.join(f['mutations'])}: "
                         f"{detail[-1] if detail else ''}"[:300])
        return "\n".join(lines)


def model_cases(count: int, seed: int, corpus: str = "builtin", targets=("cpu", "interpreter")) -> list[dict]:
    rng = np.random.default_rng(seed)
    seeds = seeds_for(corpus)
    cases = []
    for i in range(count):
        s = seeds[int(rng.integers(len(seeds)))]
        data, feeds, done = mutate_model(s, rng)
        cases.append({"kind": "model", "model": data, "feeds": feeds, "seed": seed * 1_000_003 + i,
                      "target": targets[int(rng.integers(len(targets)))], "origin": s.name, "mutations": done})
    return cases


ARTIFACT_BASES = ("relu_add", "conv", "gather", "int_div_mod", "reshape_transpose", "scatter_nd")


def artifact_cases(count: int, seed: int, folder: Path, bases: tuple = ARTIFACT_BASES) -> list[dict]:
    """Mutated copies of artifacts of a few built-in seeds (compiled here, for cpu)."""
    import kiln
    rng = np.random.default_rng(seed + 7)
    folder.mkdir(parents=True, exist_ok=True)
    names, bases = bases, []
    for s in builtin_seeds():
        if s.name not in names:
            continue
        path = folder / f"seed_{s.name}.kiln"
        m = kiln.compile(s.model, target="cpu")
        dims = {d: 2 for spec in m.inputs for d in (spec.shape or ()) if isinstance(d, str)}
        kiln.save(m, path, dims=dims, source=s.model.SerializeToString())
        bases.append((s.name, path.read_bytes()))
    cases = []
    for i in range(count):
        name, data = bases[int(rng.integers(len(bases)))]
        mutated, done = mutate_artifact(data, rng)
        path = folder / f"case_{seed}_{i}.kiln"
        path.write_bytes(mutated)
        cases.append({"kind": "artifact", "path": str(path), "seed": seed * 1_000_003 + i,
                      "origin": name, "mutations": done})
    return cases


def run_campaign(models: int = 200, artifacts: int = 0, seed: int = 0, *, corpus: str = "builtin",
                 jobs: int = 2, timeout_s: float = 60.0, memory_bytes: int = 4 << 30, batch: int = 50,
                 out: str | os.PathLike | None = None, targets=("cpu", "interpreter"),
                 progress: Callable[[int, int], None] | None = None, workdir: str | os.PathLike | None = None,
                 artifact_bases: tuple = ARTIFACT_BASES) -> Report:
    """Make and run `models` mutated models and `artifacts` mutated artifacts; failing cases are
    saved under `out` (when given) for replay."""
    import tempfile
    t0 = time.perf_counter()
    report = Report()
    with tempfile.TemporaryDirectory(prefix="kiln-mutate-", dir=workdir) as tmp:
        cases = model_cases(models, seed, corpus, targets) if models else []
        if artifacts:
            cases += artifact_cases(artifacts, seed, Path(tmp), artifact_bases)
        box = Sandbox("kiln.testing.mutate:run_case", timeout_s=timeout_s, memory_bytes=memory_bytes,
                      jobs=jobs, batch=batch)
        done = [0]

        def tick(o: Outcome) -> None:
            done[0] += 1
            if progress is not None:
                progress(done[0], len(cases))
        for o in box.run(cases, tick):
            case = cases[o.index]
            report.counts[(case["kind"], o.kind)] += 1
            if o.failed:
                report.failures.append(_failure(case, o, out))
            elif o.detail.startswith("wraps "):
                report.wrapped[o.detail.split(";")[0].removeprefix("wraps ")] += 1
    report.seconds = time.perf_counter() - t0
    return report


def _failure(case: dict, o: Outcome, out) -> dict:
    rec = {"kind": case["kind"], "seed": case["origin"], "mutations": case["mutations"], "outcome": o.kind,
           "detail": o.detail, "target": case.get("target"), "case_seed": case["seed"]}
    if out is not None:
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        stem = f"{case['kind']}_{case['seed']}"
        if case["kind"] == "model":
            (folder / f"{stem}.onnx").write_bytes(case["model"])
            if case.get("feeds"):
                np.savez(folder / f"{stem}.feeds.npz", **{f"i{k}": v for k, v in enumerate(case["feeds"].values())})
            rec["file"] = str(folder / f"{stem}.onnx")
        else:
            dest = folder / f"{stem}.kiln"
            dest.write_bytes(Path(case["path"]).read_bytes())
            rec["file"] = str(dest)
        with open(folder / "failures.jsonl", "a") as f:
            f.write(json.dumps(rec) + "\n")
    return rec
