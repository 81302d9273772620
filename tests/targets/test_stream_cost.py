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
    monkeypatch.delenv("KILN_STREAM_RATE_ALL", raising=False)
    monkeypatch.setattr(stream_cost, "_MEASURED", {})
    monkeypatch.setattr(stream_cost, "measure_all", lambda t: (5210.5, 9))
    monkeypatch.setattr(stream_cost, "busy", lambda cores: False)
    return tmp_path / "store" / "stream-rate"


def host(**kw) -> Target:
    return dataclasses.replace(Target.host(), **kw)


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_the_loop_builds_and_times_a_stream():
    rate = stream_cost.measure(host(), passes=3, nbytes=1 << 20)
    assert 10 < rate < 1e7      # floats per us: 40 MB/s to 40 TB/s


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_the_all_cores_loop_times_every_core_at_once():
    rate, kept = stream_cost.measure_all(host(cores=2), passes=3, nbytes=1 << 20)
    assert 10 < rate < 1e7 and 0 <= kept <= 3


def test_each_thread_streams_its_share_past_the_caches():
    assert stream_cost.thread_bytes(host(cores=2, l2_bytes=2 << 20, l3_bytes=1 << 30)) == stream_cost.BUFFER_CAP // 2
    assert stream_cost.thread_bytes(host(cores=64, l2_bytes=2 << 20, l3_bytes=1 << 30)) == 8 << 20    # 4 x L2


def test_the_buffer_outgrows_the_caches():
    t = host(l2_bytes=2 << 20, l3_bytes=8 << 20)
    assert stream_cost.buffer_bytes(t) == 16 << 20                     # twice L3
    assert stream_cost.buffer_bytes(host(l2_bytes=2 << 20, l3_bytes=1 << 20)) == 16 << 20   # 8 x L2
    assert stream_cost.buffer_bytes(host(l3_bytes=1 << 30)) == stream_cost.BUFFER_CAP


def test_measured_once_then_read_from_the_cache(fresh, monkeypatch):
    calls = []
    monkeypatch.setattr(stream_cost, "measure", lambda t: calls.append(t) or 3210.5)
    every = []
    monkeypatch.setattr(stream_cost, "measure_all", lambda t: every.append(t) or (5210.5, 7))
    t = stream_cost.calibrated(host())
    assert t.stream_rate == 3210.0 and len(calls) == 1 and "stream=3210" in t.key()
    assert t.stream_rate_all == 5210.0 and len(every) == 1 and "stream_all=5210" in t.key()
    assert t.key() != host().key()
    stored = json.loads(next(p for p in fresh.glob("*.json") if not p.name.startswith("all-")).read_text())
    assert stored["floats_per_us"] == 3210.5 and stored["buffer_bytes"] == stream_cost.buffer_bytes(host())
    stored = json.loads(next(fresh.glob("all-*.json")).read_text())
    assert stored["all_cores_floats_per_us"] == 5210.5 and stored["concurrent_passes"] == 7
    assert stored["threads"] == host().cores and stored["thread_bytes"] == stream_cost.thread_bytes(host())
    monkeypatch.setattr(stream_cost, "_MEASURED", {})      # a new process: the files answer
    t = stream_cost.calibrated(host())
    assert (t.stream_rate, t.stream_rate_all) == (3210.0, 5210.0) and len(calls) == len(every) == 1
    # more cores (or another loop) are another all-cores measurement, the same one-core one
    stream_cost.calibrated(host(cores=host().cores + 2))
    assert len(calls) == 1 and len(every) == 2
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
    monkeypatch.setattr(stream_cost, "measure_all", fail)
    assert stream_cost.calibrated(host()) == host()
    assert host().stream_rate == STREAM_FLOATS_PER_US and host().stream_rate_all == host().cores * STREAM_FLOATS_PER_US
    assert not list(fresh.iterdir())


def test_a_busy_machine_stores_no_all_cores_rate(fresh, monkeypatch):
    """No pass ran on every core at once: the sum would be of rates taken one after another, so
    nothing is kept; this process streams each core at its own rate and measures no more."""
    every = []
    monkeypatch.setattr(stream_cost, "measure", lambda t: 3210.5)
    monkeypatch.setattr(stream_cost, "measure_all", lambda t: every.append(t) or (6400.0, 0))
    for _ in range(2):
        t = stream_cost.calibrated(host(cores=2))
        assert (t.stream_rate, t.stream_rate_all) == (3210.0, 6420.0) and "stream_all" not in t.key()
    assert len(every) == 1 and not list(fresh.glob("all-*.json"))
    # a machine busier than it has cores does not try (asked again at the next compile)
    monkeypatch.setattr(stream_cost, "_MEASURED", {})
    monkeypatch.setattr(stream_cost, "busy", lambda cores: True)
    assert stream_cost.calibrated(host(cores=2)).stream_rate_all == 6420.0 and len(every) == 1
    monkeypatch.setattr(stream_cost, "busy", lambda cores: False)
    stream_cost.calibrated(host(cores=2))
    assert len(every) == 2


def test_overrides_and_other_cpus(fresh, monkeypatch):
    monkeypatch.setattr(stream_cost, "measure", lambda t: pytest.fail("measured despite an override"))
    monkeypatch.setattr(stream_cost, "measure_all", lambda t: pytest.fail("measured despite an override"))
    monkeypatch.setenv("KILN_STREAM_RATE", "1500")
    t = stream_cost.calibrated(host(cores=2))
    assert t.stream_rate == 1500 and t.stream_rate_all == 3000     # each core its own: not measured
    monkeypatch.setenv("KILN_STREAM_RATE_ALL", "1800")
    t = stream_cost.calibrated(host(cores=2))
    assert (t.stream_rate, t.stream_rate_all) == (1500, 1800) and "stream_all=1800" in t.key()
    monkeypatch.setenv("KILN_STREAM_RATE_ALL", "fast")
    with pytest.raises(KilnError, match="KILN_STREAM_RATE_ALL"):
        stream_cost.calibrated(host())
    monkeypatch.delenv("KILN_STREAM_RATE_ALL")
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


def test_cores_sharing_one_stream_read_winograds_weights_slower():
    """Where the cores read weights together no faster than one (a shared stream, the all-cores
    rate measured), Winograd's transformed weights take twice as long on 2 cores as where each
    core streams its share at its own rate: 512 -> 512 on 10x10 (9.4 MB, 100 pixels) turns direct;
    256 -> 256 on 14x14 stays Winograd."""
    own, shared = (Target.named("host", cores=2, stream_rate_measured=3.2e3, stream_rate_all_measured=r)
                   for r in (0.0, 3.3e3))
    assert own.stream_rate_all == 6.4e3
    assert choose(_shape(512, 512, 10), own).algorithm == "winograd"
    c = choose(_shape(512, 512, 10), shared)
    assert c.algorithm == "direct-nchwc" and "~2860 us to stream on 2 cores" in c.reason
    assert choose(_shape(256, 256, 14), shared).algorithm == "winograd"


def test_cores_sharing_one_stream_do_not_fork_for_weights():
    """A squeeze-excite 1x1 conv bound by its weights forks where each core streams its half at its
    own rate, not where both read at one core's rate together (the fork saves nothing then)."""
    weights = 960 * 240
    own, shared = (Target.named("host", cores=2, fork_us_measured=20.0, stream_rate_measured=3e3,
                                stream_rate_all_measured=r) for r in (0.0, 3e3))
    assert parallel_worth(weights, own, "conv", streamed=weights)
    assert not parallel_worth(weights, shared, "conv", streamed=weights)
