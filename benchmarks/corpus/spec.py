"""What a corpus model is: a torch builder, its inputs (with symbolic dims), the shapes it is
benchmarked at, and how it is exported. No torch import here: the runner needs none."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

FAMILIES = ("cnn", "transformer", "rnn", "small")


@dataclass(frozen=True)
class Input:
    """One model input. `shape` holds ints and symbol names ("batch", "seq", ...).
    Integer inputs are drawn uniformly from [low, high) (token ids in the vocabulary);
    float inputs are standard normal."""
    name: str
    shape: tuple
    dtype: str = "float32"
    low: int = 0
    high: int = 2


@dataclass(frozen=True)
class Spec:
    """A corpus model. `make()` returns a torch.nn.Module in eval mode (seeded by the caller)
    whose forward takes the inputs in order. `cases` bind the symbols, one benchmark shape each;
    `trace` binds them for the export (sizes > 1, so no exporter specialises a dim to 1)."""
    name: str
    family: str
    make: Callable
    inputs: tuple[Input, ...]
    cases: tuple[dict, ...]
    trace: dict
    outputs: tuple[str, ...] = ("output",)
    exporter: str = "torchscript"      # or "dynamo" (torch.export-based)
    opset: int = 17
    note: str = ""

    def __post_init__(self):
        assert self.family in FAMILIES, self.family
        assert self.exporter in ("torchscript", "dynamo"), self.exporter
        assert 13 <= self.opset <= 21, self.opset
        assert len(self.cases) >= 2, f"{self.name}: benchmark it at two shapes or more"


def case_label(case: dict) -> str:
    """'batch=1,seq=32': the shape a row is measured at."""
    return ",".join(f"{k}={v}" for k, v in case.items())


def concrete(shape: tuple, dims: dict) -> tuple[int, ...]:
    return tuple(d if isinstance(d, int) else int(dims[d]) for d in shape)
