"""The ONNX backend test suite, run through `kiln.onnx_backend` as pytest cases.

By default each case runs on the interpreter at -O0 and at -O3 (the graph passes
must not change a single result), and on the cpu target at its default (-O3) — that
configuration compiles ~2,000 native modules, so it is marked slow. `KILN_TARGET`
(and `KILN_OPT_LEVEL`) pick one configuration instead. Expected
failures live in `expected_failures/<target>/*.txt` (`case_name  # reason`);
they are strict: one that starts passing fails the run, so the list stays true.
The one exception is a reason starting with "nondeterministic:" (an unseeded
random op compared with another RNG's draws, which can match by chance).
"""

from __future__ import annotations

import glob
import os

import pytest

from kiln import onnx_backend
from tests.conformance.cases import assert_similar, model_cases, node_cases, normalize

HERE = os.path.dirname(__file__)


def configs() -> list[tuple[str, int | None, bool]]:
    """(target, opt level or None for the default, slow) to run the suite under."""
    target = os.environ.get("KILN_TARGET")
    if target:
        level = os.environ.get("KILN_OPT_LEVEL")
        return [(target, int(level) if level else None, False)]
    return [("interpreter", 0, False), ("interpreter", 3, False), ("cpu", None, True)]


def expected_failures(target: str) -> dict[str, str]:
    out = {}
    for path in sorted(glob.glob(os.path.join(HERE, "expected_failures", target, "*.txt"))):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                name, _, reason = line.partition("#")
                if not reason.strip():
                    raise ValueError(f"{path}: expected failure {name.strip()!r} has no reason")
                out[name.strip()] = reason.strip()
    return out


XFAIL = {t: expected_failures(t) for t in {c[0] for c in configs()}}


def _params(cases):
    out = []
    for target, level, slow in configs():
        xfail = XFAIL[target]
        for c in cases:
            marks = [pytest.mark.slow] if slow else []
            reason = xfail.get(c.name)
            if reason:
                marks.append(pytest.mark.xfail(strict=not reason.startswith("nondeterministic:"),
                                               reason=reason))
            tag = target if level is None else f"{target}-O{level}"
            out.append(pytest.param(c, target, level, id=f"{tag}-{c.name}", marks=marks))
    return out


def _run_case(case, target, level):
    model, data_sets = case.load()
    options = {} if level is None else {"opt_level": level}
    rep = onnx_backend.prepare(model, "CPU", target=target, **options)
    for inputs, ref in data_sets:
        outs = rep.run([normalize(x) for x in inputs])
        assert_similar([normalize(r) for r in ref], list(outs), case.rtol, case.atol)


@pytest.mark.parametrize("case, target, level", _params(node_cases()))
def test_onnx_node(case, target, level):
    _run_case(case, target, level)


@pytest.mark.parametrize("case, target, level", _params(model_cases()))
def test_onnx_model(case, target, level):
    _run_case(case, target, level)


def test_expected_failures_name_real_cases():
    names = {c.name for c in node_cases()} | {c.name for c in model_cases()}
    for target, xfail in XFAIL.items():
        stale = sorted(set(xfail) - names)
        assert not stale, f"{target}: expected-failure entries that are not ONNX test cases: {stale}"
