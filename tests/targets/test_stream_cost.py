"""The host's stream rate (floats per us one core reads from beyond its caches) is measured once
per machine, cached, and steers the choices that weigh weights read once per inference
(kiln.codegen.stream_cost): KILN_STREAM_RATE overrides, a CPU other than the host keeps the
table's figure."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from kiln.codegen import fork_cost, stream_cost
from kiln.errors import KilnError
from kiln.lower.conv_algo import ConvShape, choose
from kiln.lower.nnutil import parallel_worth
from kiln.targets.target import STREAM_FLOATS_PER_US, Target


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """An empty store, no override, nothing remembered by this process."""
    (tmp_path / "store").mkdir()
    monkeypatch.setattr(stream_cost, "store_dir", lambda kind: tmp_path / "store" / kind)
    (tmp_path / "store" / "stream-rate").mkdir()
    monkeypatch.delenv("KILN_STREAM_RATE", raising=False)
    monkeypatch.setattr(stream_cost, "_MEASURED", {})
    return tmp_path / "store" / "stream-rate"


def host(**kw) -> Target:
    return dataclasses.replace(Target.host(), **kw)


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_the_loop_builds_and_times_a_stream():
    rate = stream_cost.measure(host(), passes=3, nbytes=1 << 20)
    assert 10 < rate < 1e7      # floats per us: 40 MB/s to 40 TB/s


def test_the_buffer_outgrows_the_caches():
    t = host(l2_bytes=2 << 20, l3_bytes=8 << 20)
    assert stream_cost.buffer_bytes(t) == 16 << 20                     # twice L3
    assert stream_cost.buffer_bytes(host(l2_bytes=2 << 20, l3_bytes=1 << 20)) == 16 << 20   # 8 x L2
    assert stream_cost.buffer_bytes(host(l3_bytes=1 << 30)) == stream_cost.BUFFER_CAP


def test_measured_once_then_read_from_the_cache(fresh, monkeypatch):
    calls = []
    monkeypatch.setattr(stream_cost, "measure", lambda t: calls.append(t) or 3210.5)
    t = stream_cost.calibrated(host())
    assert t.stream_rate == 3210.0 and len(calls) == 1 and "stream=3210" in t.key()
    assert t.key() != host().key()
    stored = json.loads(next(fresh.glob("*.json")).read_text())
    assert stored["floats_per_us"] == 3210.5 and stored["buffer_bytes"] == stream_cost.buffer_bytes(host())
    monkeypatch.setattr(stream_cost, "_MEASURED", {})      # a new process: the file answers
    assert stream_cost.calibrated(host()).stream_rate == 3210.0 and len(calls) == 1
    # the compiler's calibration takes it with the fork cost
    monkeypatch.setenv("KILN_FORK_US", "table")
    assert fork_cost.calibrated(host()).stream_rate == 3210.0
    # another machine (its caches) is another measurement
    stream_cost.calibrated(host(l3_bytes=host().l3_bytes + (1 << 20)))
    assert len(calls) == 2


def test_a_failed_measurement_keeps_the_table(fresh, monkeypatch):
    def fail(t):
        raise KilnError("the stream-rate loop did not compile: no cc")
    monkeypatch.setattr(stream_cost, "measure", fail)
    assert stream_cost.calibrated(host()).stream_rate == STREAM_FLOATS_PER_US
    assert not list(fresh.iterdir())


def test_overrides_and_other_cpus(fresh, monkeypatch):
    monkeypatch.setattr(stream_cost, "measure", lambda t: pytest.fail("measured despite an override"))
    monkeypatch.setenv("KILN_STREAM_RATE", "1500")
    assert stream_cost.calibrated(host()).stream_rate == 1500
    monkeypatch.setenv("KILN_STREAM_RATE", "table")
    assert stream_cost.calibrated(host()) == host() and host().stream_rate == STREAM_FLOATS_PER_US
    for bad in ("fast", "0", "-3"):
        monkeypatch.setenv("KILN_STREAM_RATE", bad)
        with pytest.raises(KilnError, match="KILN_STREAM_RATE"):
            stream_cost.calibrated(host())
    monkeypatch.delenv("KILN_STREAM_RATE")
    named = Target.named("x86-64-v3")
    assert stream_cost.calibrated(named) is named     # not this machine: the table's figure
    measured = host(stream_rate_measured=2000.0)
    assert stream_cost.calibrated(measured) is measured


def _shape(c, oc, hw):
    return ConvShape(n=1, c=c, oc=oc, out=(hw, hw), kernel=(3, 3), strides=(1, 1), dilations=(1, 1), group=1,
                     blockable=True, block=16)


def test_the_stream_rate_decides_winograd_against_direct():
    """Winograd's transformed weights (36/9 of the direct conv's) stream once per inference: on 2
    cores 256 -> 256 on 14x14 (16 tiles, 9.4 MB) keeps Winograd where a core streams 7e3 floats
    per us and runs direct where it streams 1e3; 512 -> 512 on 7x7 runs Winograd at 7e3, direct
    at this VM's 3.2e3."""
    fast, mid, slow = (Target.named("host", cores=2, stream_rate_measured=r) for r in (7e3, 3.2e3, 1e3))
    assert choose(_shape(256, 256, 14), fast).algorithm == "winograd"
    c = choose(_shape(256, 256, 14), slow)
    assert c.algorithm == "direct-nchwc" and "9.4 MB" in c.reason and "~1180 us to stream" in c.reason
    assert choose(_shape(512, 512, 7), fast).algorithm == "winograd"
    assert choose(_shape(512, 512, 7), mid).algorithm == "direct-nchwc"


def test_the_stream_rate_decides_what_forks():
    """A 1x1 conv on one pixel (a squeeze-excite block's) does little arithmetic for its weights:
    it forks where reading them takes long enough to pay for a fork, at the target's rate."""
    weights = 960 * 240
    work = weights                                      # one multiply-add per weight
    fast, slow = (Target.named("host", cores=2, fork_us_measured=20.0, stream_rate_measured=r) for r in (1e5, 3e3))
    assert not parallel_worth(work, fast, "conv", streamed=weights)     # 2.3 us to stream: serial
    assert parallel_worth(work, slow, "conv", streamed=weights)         # 77 us: forks
