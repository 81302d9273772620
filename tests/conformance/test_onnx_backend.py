"""The ONNX backend test suite, run through `kiln.onnx_backend` as pytest cases.

The target comes from `KILN_TARGET` (default here: interpreter). Expected
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

TARGET = os.environ.get("KILN_TARGET", "interpreter")
HERE = os.path.dirname(__file__)


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


XFAIL = expected_failures(TARGET)


def _params(cases):
    def marks(name):
        if name not in XFAIL:
            return []
        reason = XFAIL[name]
        return [pytest.mark.xfail(strict=not reason.startswith("nondeterministic:"), reason=reason)]
    return [pytest.param(c, id=c.name, marks=marks(c.name)) for c in cases]


def _run_case(case):
    model, data_sets = case.load()
    rep = onnx_backend.prepare(model, "CPU", target=TARGET)
    for inputs, ref in data_sets:
        outs = rep.run([normalize(x) for x in inputs])
        assert_similar([normalize(r) for r in ref], list(outs), case.rtol, case.atol)


@pytest.mark.parametrize("case", _params(node_cases()))
def test_onnx_node(case):
    _run_case(case)


@pytest.mark.parametrize("case", _params(model_cases()))
def test_onnx_model(case):
    _run_case(case)


def test_expected_failures_name_real_cases():
    names = {c.name for c in node_cases()} | {c.name for c in model_cases()}
    stale = sorted(set(XFAIL) - names)
    assert not stale, f"expected-failure entries that are not ONNX test cases: {stale}"
