"""The fuzzer's fixed-seed budget: 300 generated graphs, each compiled for cpu at two -O levels
rotating with the seed (all four covered), compared with the interpreter at -O0 and the
interpreter at the same level, and with ONNX Runtime where it accepts the graph. The default
suite runs the first 100 (KILN_FUZZ_GRAPHS to change it; 600 native modules were a tenth of the
suite's time on CI's 2 cores), -m slow the rest, and thousands more at every level.

A failure here names the seeds and the failure; `kiln fuzz --seed S --count 1 --out DIR`
shrinks it into a regression file for tests/regressions/fuzz/.
"""

import os

import pytest

from kiln.testing.differential import campaign

FIXED = 300
GRAPHS = int(os.environ.get("KILN_FUZZ_GRAPHS", "100"))
SLOW_GRAPHS = int(os.environ.get("KILN_FUZZ_SLOW_GRAPHS", "3000"))


def _report(c) -> str:
    lines = [f"{len(c.findings)} of {c.cases} graphs failed:"]
    for sig, hits in c.by_signature().items():
        seeds = sorted({s for s, _ in hits})
        lines.append(f"  seeds {seeds[:10]}: {hits[0][1]}")
    return "\n".join(lines)


def test_fixed_seed_budget():
    c = campaign(range(GRAPHS), levels_per_graph=2, timeout=180)
    assert c.cases == GRAPHS
    assert set(c.levels_run) == {0, 1, 2, 3}
    assert not c.findings, _report(c)


@pytest.mark.slow
def test_rest_of_the_fixed_seed_budget():
    c = campaign(range(GRAPHS, max(GRAPHS, FIXED)), levels_per_graph=2, timeout=180)
    assert not c.findings, _report(c)


@pytest.mark.slow
def test_slow_budget():
    c = campaign(range(100_000, 100_000 + SLOW_GRAPHS), levels_per_graph=4, timeout=300)
    assert not c.findings, _report(c)
