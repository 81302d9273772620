"""The host's fork cost is measured once per machine and settings, cached, and steers the fork
decisions (kiln.codegen.fork_cost): a busy machine does not measure, KILN_FORK_US overrides,
a CPU other than the host keeps the table's figure."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil

import numpy as np
import pytest

from kiln.codegen import fork_cost
from kiln.errors import KilnError
from kiln.runtime import threads
from kiln.targets.target import Target


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """An empty cache, no override, nothing remembered by this process, an idle machine."""
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "store").mkdir()
    monkeypatch.setattr(fork_cost, "store_dir", lambda kind: tmp_path / "store")
    monkeypatch.delenv("KILN_FORK_US", raising=False)
    monkeypatch.setattr(fork_cost, "_MEASURED", {})
    monkeypatch.setattr(fork_cost, "busy", lambda cores: False)
    return tmp_path


def host(**kw) -> Target:
    return dataclasses.replace(Target.host(), **kw)


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
@pytest.mark.parametrize("impl", ["omp", "pool"])
def test_the_loop_builds_and_times_a_fork(impl):
    us = fork_cost.measure(host(threads_impl=impl), regions=20, gap_us=0)
    assert 0 < us < 1e5


def test_measured_once_then_read_from_the_cache(fresh, monkeypatch):
    calls = []
    monkeypatch.setattr(fork_cost, "measure", lambda t: calls.append(t) or 12.34)
    t = fork_cost.calibrated(host(threads_impl="omp"))
    assert t.fork_us == 12.3 and calls and t.key() != host(threads_impl="omp").key()
    assert "fork_us=12.3" in t.key()
    stored = json.loads(next((fresh / "store").glob("*.json")).read_text())
    assert stored["fork_us"] == 12.34 and stored["threads"] == "omp"
    monkeypatch.setattr(fork_cost, "_MEASURED", {})    # a new process: the file answers
    assert fork_cost.calibrated(host(threads_impl="omp")).fork_us == 12.3 and len(calls) == 1
    # other settings are another measurement, and so is another pool
    fork_cost.calibrated(host(threads_impl="pool"))
    assert len(calls) == 2 and calls[1].threads_impl == "pool"
    monkeypatch.setattr(fork_cost, "_MEASURED", {})
    source = fork_cost.program_source
    monkeypatch.setattr(fork_cost, "program_source", lambda impl: source(impl) + "/* changed */")
    fork_cost.calibrated(host(threads_impl="pool"))
    assert len(calls) == 3


def test_a_busy_machine_keeps_the_table_and_tries_again(fresh, monkeypatch):
    calls = []
    monkeypatch.setattr(fork_cost, "measure", lambda t: calls.append(t) or 30.0)
    monkeypatch.setattr(fork_cost, "busy", lambda cores: True)
    t = fork_cost.calibrated(host(threads_impl="omp"))
    assert t.fork_us == threads.fork_us(t.omp_wait_policy, t.omp_spincount, "omp") and not calls
    assert not list((fresh / "store").iterdir())
    monkeypatch.setattr(fork_cost, "busy", lambda cores: False)
    assert fork_cost.calibrated(host(threads_impl="omp")).fork_us == 30.0 and len(calls) == 1


def test_overrides_and_other_cpus(fresh, monkeypatch):
    monkeypatch.setattr(fork_cost, "measure", lambda t: pytest.fail("measured despite an override"))
    monkeypatch.setenv("KILN_FORK_US", "7.5")
    assert fork_cost.calibrated(host()).fork_us == 7.5
    monkeypatch.setenv("KILN_FORK_US", "table")
    assert fork_cost.calibrated(host()) == host()
    monkeypatch.setenv("KILN_FORK_US", "soon")
    with pytest.raises(KilnError, match="KILN_FORK_US"):
        fork_cost.calibrated(host())
    monkeypatch.delenv("KILN_FORK_US")
    named = Target.named("x86-64-v3")
    assert fork_cost.calibrated(named) is named     # not this machine: the table's figure


def _model(kind: str):
    from onnx import TensorProto, helper, numpy_helper
    if kind == "conv":   # a 1x1 conv of 64 channels over 12x12
        w = np.random.default_rng(0).standard_normal((64, 64, 1, 1)).astype(np.float32)
        nodes, shape, inits = [helper.make_node("Conv", ["x", "w"], ["y"])], [1, 64, 12, 12], \
            [numpy_helper.from_array(w, "w")]
    else:                # an injective kernel of 100k elements
        nodes, shape, inits = [helper.make_node("Add", ["x", "x"], ["s"]), helper.make_node("Relu", ["s"], ["y"])], \
            [1, 256, 400], []
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("kind", ["conv", "elementwise"])
def test_the_measured_cost_decides_what_forks(monkeypatch, kind):
    """A kernel whose threads save a few us forks where a fork costs 1 us, not where it costs 1000."""
    pytest.importorskip("onnx")
    from kiln.stages import stage_text
    model = _model(kind)
    texts = {}
    for us in ("1", "1000"):
        monkeypatch.setenv("KILN_FORK_US", us)
        texts[us] = stage_text(model, "c", {}, cpu=Target.host())
    forks = {us: bool(re.search(r"#pragma omp parallel for|kiln_pool_for\(\w+, &", t)) for us, t in texts.items()}
    assert forks == {"1": True, "1000": False}
