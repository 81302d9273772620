"""Shared helpers for loop-level tests: lower + compile + run against numpy."""

import numpy as np
import pytest

from kiln.codegen import build_c
from kiln.loops import LoopModule, lower


def run_schedule(sch, inputs, outputs, arrays, name="kernel", cflags=None):
    """Lower `sch` with params inputs+outputs, compile, run on `arrays`; return outputs."""
    func = lower(sch, list(inputs) + list(outputs), name)
    lib = build_c(LoopModule([func]), cflags=cflags)
    outs = [np.full(t.shape, np.nan if t.dtype.is_float else 0, dtype=t.dtype.np) for t in outputs]
    lib[name](*arrays, *outs)
    return outs


@pytest.fixture(scope="session")
def run():
    return run_schedule
