"""The model corpus (benchmarks/corpus/): its specs are well-formed, and two small models build
(torch export with symbolic dims), run in ONNX Runtime and compile with kiln to the same
numbers at each of their shapes. Skipped where torch is not installed (CI); the corpus itself
is benchmarked by `python benchmarks/corpus.py`, never in the test run."""

from __future__ import annotations

import os

import numpy as np
import pytest

from benchmarks.corpus import FAMILIES, select
from benchmarks.corpus.build import random_feeds
from benchmarks.corpus.run import geomean, kind_of_kernel, summary
from benchmarks.corpus.spec import Input

pytest.importorskip("onnxruntime")


def test_random_feeds_are_never_zero_and_ids_in_range():
    ins = [{"name": "ids", "shape": ["batch", "seq"], "dtype": "int64", "low": 5, "high": 9},
           {"name": "x", "shape": ["batch", 3], "dtype": "float32", "low": 0, "high": 2}]
    f = random_feeds(ins, {"batch": 2, "seq": 7}, seed=1)
    assert f["ids"].shape == (2, 7) and f["ids"].min() >= 5 and f["ids"].max() < 9
    assert f["x"].shape == (2, 3) and f["x"].dtype == np.float32 and np.all(f["x"] != 0)
    assert not np.array_equal(f["x"], random_feeds(ins, {"batch": 2, "seq": 7}, seed=2)["x"])
    assert random_feeds([Input("y", (4,))], {}, 0)["y"].shape == (4,)


def test_summary_geomeans_only_matching_rows_per_family():
    rows = [{"model": "a", "family": "cnn", "ok": True, "ratio": 2.0},
            {"model": "b", "family": "cnn", "ok": True, "ratio": 0.5},
            {"model": "c", "family": "rnn", "ok": False, "ratio": 9.0},
            {"model": "d", "family": "small", "ok": True, "ratio": 4.0}]
    s = summary(rows)
    assert s["geomean_by_family"]["cnn"] == pytest.approx(1.0)
    assert s["geomean_by_family"]["rnn"] is None and s["models_failing"] == ["c"]
    assert s["geomean"] == pytest.approx(geomean([2.0, 0.5, 4.0]))


def test_profile_kinds_name_the_heaviest_op_of_a_fused_kernel():
    assert kind_of_kernel("Add node 'a' + Conv node 'b' + Relu node 'c'") == "Conv"
    assert kind_of_kernel("Sigmoid node 's'") == "Sigmoid"


def test_select_by_name_and_family():
    metas = [{"name": "m1", "family": "cnn"}, {"name": "m2", "family": "rnn"}]
    assert select(metas, family="rnn") == [metas[1]]
    assert select(metas, only="m1,m2", family="cnn") == [metas[0]]
    with pytest.raises(SystemExit):
        select(metas, only="nope")


def test_corpus_specs_cover_the_families():
    pytest.importorskip("torch")
    from benchmarks.corpus import specs
    all_specs = specs()
    assert len(all_specs) >= 30
    assert {s.family for s in all_specs} == set(FAMILIES)
    for s in all_specs:
        assert any(isinstance(d, str) for i in s.inputs for d in i.shape), f"{s.name}: no symbolic dim"


@pytest.mark.parametrize("name", ["mlp_tabular", "kws_dscnn"])
def test_small_corpus_model_builds_and_kiln_matches_ort(name, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    import kiln
    from benchmarks.corpus import specs
    from benchmarks.corpus.build import build, paths
    from kiln.bench import compare, ort_session
    monkeypatch.setenv("KILN_CORPUS_DIR", str(tmp_path))
    spec = select(specs(), only=name)[0]
    meta = build(spec, log=lambda *_: None)
    path = paths(spec)[0]
    assert os.path.exists(path) and meta["opset"] == spec.opset
    assert build(spec, log=lambda *_: None) == meta   # cached: not built again
    compiled = kiln.compile(path)
    sess = ort_session(path, 1)
    for k, case in enumerate(spec.cases):
        feeds = random_feeds(meta["inputs"], case, seed=10 + k)
        want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
        assert np.abs(next(iter(want.values()))).max() > 0
        got = compiled.run(feeds)
        res = compare(got, want, 1e-3, 1e-4)
        assert res["ok"], (case, res)
