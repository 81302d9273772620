"""Where compile time goes: wall and CPU seconds per pipeline stage.

Compile time is a feature (DESIGN.md), so it is measured where it is spent. Each stage
of the pipeline (kiln.compiler) and of the build (kiln.codegen.build: the C compiler, the
linker) runs inside `stage(name)`; while a `recording()` block is open in this thread
(or task: a context variable, so two threads compiling at once keep separate books),
the stage's wall seconds and CPU seconds are added to its `StageTimes`. Outside any
recording a stage costs two clock reads. CPU seconds count this process and the
compiler processes it waited for: on a loaded machine wall time grows, CPU time much less.

`kiln.compile(..., report=True)` shows them in its report; `kiln bench` and
benchmarks/compile_time.py record the cold and warm compiles.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import time
from dataclasses import dataclass, field

# the stages in pipeline order (a stage not listed is shown after these)
ORDER = ("frontend", "optimize", "specialize", "probe cc", "cache key", "cache load", "partition", "lower",
         "plan memory", "emit module", "generate C", "cc", "link", "load")


@dataclass
class StageTimes:
    """Seconds per stage (summed over its runs: a model built at several shapes runs
    its stages several times)."""
    wall: dict = field(default_factory=dict)     # stage -> wall seconds
    cpu: dict = field(default_factory=dict)      # stage -> CPU seconds (this process + children)
    runs: dict = field(default_factory=dict)     # stage -> how many times it ran
    _open: list = field(default_factory=list, repr=False)   # [wall, cpu] of the stages inside each open one

    def add(self, name: str, wall: float, cpu: float) -> None:
        self.wall[name] = self.wall.get(name, 0.0) + wall
        self.cpu[name] = self.cpu.get(name, 0.0) + cpu
        self.runs[name] = self.runs.get(name, 0) + 1

    def stages(self) -> list[str]:
        rank = {s: k for k, s in enumerate(ORDER)}
        return sorted(self.wall, key=lambda s: (rank.get(s, len(ORDER)), s))

    @property
    def total_wall(self) -> float:
        return sum(self.wall.values())

    def rows(self) -> list[tuple[str, float, float, int]]:
        """(stage, wall s, cpu s, runs) in pipeline order."""
        return [(s, self.wall[s], self.cpu[s], self.runs[s]) for s in self.stages()]

    def to_json(self) -> dict:
        return {s: {"wall_s": w, "cpu_s": c, "runs": n} for s, w, c, n in self.rows()}

    def __str__(self) -> str:
        lines = [f"  {s:<12} {w * 1e3:8.1f} ms wall {c * 1e3:8.1f} ms cpu" + (f"  ({n} runs)" if n > 1 else "")
                 for s, w, c, n in self.rows()]
        return "\n".join(lines + [f"  {'(stages)':<12} {self.total_wall * 1e3:8.1f} ms wall"])


_current: contextvars.ContextVar[StageTimes | None] = contextvars.ContextVar("kiln_stage_times", default=None)


def cpu_seconds() -> float:
    """This process's CPU time plus that of its finished children (the C compiler)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def unrecorded() -> None:
    """No recording open in the current context (a background build's thread runs in a copy
    of its starter's context, whose recording must not see its stages)."""
    _current.set(None)


def current() -> StageTimes | None:
    """The recording open in this thread, if any."""
    return _current.get()


@contextlib.contextmanager
def recording(times: StageTimes | None = None):
    """Record the stages run in this block (this thread's) into `times` (a new one by default)."""
    times = StageTimes() if times is None else times
    token = _current.set(times)
    try:
        yield times
    finally:
        _current.reset(token)


@contextlib.contextmanager
def stage(name: str):
    """Time the block as stage `name` in the open recording, if any. A stage run inside
    another counts for itself alone (the outer one's time excludes it), so the stages add up."""
    times = _current.get()
    if times is None:
        yield
        return
    inner = [0.0, 0.0]
    times._open.append(inner)
    w, c = time.perf_counter(), cpu_seconds()
    try:
        yield
    finally:
        w, c = time.perf_counter() - w, cpu_seconds() - c
        times._open.pop()
        times.add(name, w - inner[0], c - inner[1])
        if times._open:
            times._open[-1][0] += w
            times._open[-1][1] += c
