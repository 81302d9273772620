"""Replays every shrunk fuzzer finding saved in tests/regressions/fuzz/ (`kiln fuzz --out`):
compiled at every -O level on cpu, compared with the interpreter and ONNX Runtime, in a worker
process (a crash fails the test, not the run). A file whose metadata has `kiln.fuzz.xfail`
(a cause) is a known, unfixed bug: it must still fail (strict xfail), unless its
`kiln.fuzz.xfail_strict` is "0" (a bug that shows on some machines only)."""

import glob
import os

import pytest

from kiln.testing.differential import WorkerPool, job_for_model
from kiln.testing.shrink import load_regression

HERE = os.path.join(os.path.dirname(__file__), "fuzz")
FILES = sorted(glob.glob(os.path.join(HERE, "*.onnx")))


@pytest.fixture(scope="module")
def pool():
    with WorkerPool(workers=1, timeout=180) as p:
        yield p


@pytest.mark.parametrize("path", FILES, ids=[os.path.basename(f)[:-5] for f in FILES])
def test_replay(path, pool, request):
    model, feeds, meta = load_regression(path)
    if meta.get("kiln.fuzz.xfail"):   # strict unless the bug depends on the machine (compiler, ISA)
        request.node.add_marker(pytest.mark.xfail(reason=meta["kiln.fuzz.xfail"],
                                                  strict=meta.get("kiln.fuzz.xfail_strict", "1") != "0"))
    found = pool.run([(0, job_for_model(model, feeds, (0, 1, 2, 3)))])[0]
    assert not found, "\n".join(map(str, found)) + f"\n(first found as: {meta.get('kiln.fuzz.finding')})"
