"""benchmarks/spread.py and kiln.bench.time_interleaved's raw record: every timed run is recorded
with its engine, round and place in the round (what slow runs are attributed by), the record
agrees with the times returned, and the script runs a corpus row end to end."""

from __future__ import annotations

import json
import os

import pytest

from kiln.bench import time_interleaved
from tests.helpers import matmul_corpus_row


def test_record_has_one_entry_per_timed_run_in_round_order(monkeypatch):
    monkeypatch.setattr("kiln.bench.SWITCH_PAUSE_S", 0.0)
    calls = {"a": 0, "b": 0}

    def fn(name):
        def run():
            calls[name] += 1
        return run
    raw: list = []
    times = time_interleaved({"a": fn("a"), "b": fn("b")}, {"a": 6, "b": 3}, rounds=3, record=raw)
    assert calls == {"a": 3 + 6, "b": 3 + 3}            # one untimed call per round each
    assert [r["ms"] for r in raw if r["engine"] == "a"] == times["a"]
    a = [(r["round"], r["k"]) for r in raw if r["engine"] == "a"]
    assert a == [(r, k) for r in range(3) for k in range(2)]
    assert [(r["round"], r["k"]) for r in raw if r["engine"] == "b"] == [(0, 0), (1, 0), (2, 0)]
    # rounds alternate engines: all of a's runs of a round come before b's of that round
    order = [(r["round"], r["engine"]) for r in raw]
    assert order == sorted(order)
    assert all(r["minflt"] >= 0 and r["nivcsw"] >= 0 and r["cpu_ms"] >= 0 for r in raw)
    assert all(r["wait_ms"] is None or r["wait_ms"] >= 0 for r in raw)


def test_analyse_finds_slow_first_runs_of_a_round():
    from benchmarks.spread import analyse
    raw = [{"engine": "x", "round": r, "k": k, "ms": 3.0 if k == 0 else 1.0 + 0.01 * k, "cpu_ms": 1.0,
            "minflt": 0, "majflt": 0, "nvcsw": 0, "nivcsw": 0} for r in range(5) for k in range(4)]
    a = analyse(raw, "x")
    assert a["n"] == 20 and a["per_round"] == 4
    assert a["first_over_rest"] == pytest.approx(3.0 / 1.02)
    assert a["slow_first_frac"] == 1.0 and a["between_rounds"] == pytest.approx(1.0)


def test_spread_script_runs_a_row(tmp_path, monkeypatch, capsys):
    pytest.importorskip("onnxruntime")
    matmul_corpus_row(tmp_path, 8, [{"batch": 2}, {"batch": 3}])
    monkeypatch.setenv("KILN_CORPUS_DIR", str(tmp_path))
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))   # (--ab copies the build cache)
    monkeypatch.setattr("kiln.bench.SWITCH_PAUSE_S", 0.0)
    from benchmarks import spread
    out = tmp_path / "raw.json"
    spread.main(["mm:batch=3", "--repeat", "2", "--budget", "0.001", "--no-openvino", "--json", str(out),
                 "--ab", "KILN_POOL_SPIN_US=1000"])
    text = capsys.readouterr().out
    assert "mm [batch=3] #1" in text and "mm [batch=3]: kiln " in text
    ms = json.loads(out.read_text())["measurements"]
    assert len(ms) == 2 and {r["engine"] for r in ms[0]["raw"]} == {"kiln", "kiln+KILN_POOL_SPIN_US=1000", "ort"}
    assert "KILN_POOL_SPIN_US" not in os.environ   # restored after the second copy started
    assert all(len([r for r in m["raw"] if r["engine"] == "kiln"]) >= 5 for m in ms)   # --min-runs


def test_plan_runs_gives_every_engine_as_many_runs():
    """p90/p10 reads wider from more runs: an engine is never given more runs for being faster."""
    import time

    from benchmarks.corpus.run import plan_runs
    # (the slow engine alone would get at most 1 s / 100 ms = 10 runs; the fast one reaches hi unless a
    # busy machine stalls its one timed call for 25 ms)
    runs = plan_runs({"fast": lambda: None, "slow": lambda: time.sleep(0.1)}, budget_s=1.0, lo=2, hi=40)
    assert runs["fast"] == runs["slow"] == 40          # the fast engine's count, capped at hi
    runs = plan_runs({"a": lambda: time.sleep(0.004), "b": lambda: time.sleep(0.004)}, budget_s=0.001, lo=3, hi=40)
    assert runs == {"a": 3, "b": 3}
