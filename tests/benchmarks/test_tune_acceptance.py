"""benchmarks/tune_acceptance.py's two phases over one work directory, on a tiny model with a
few seconds of tuning: the tune phase writes the database and its per-task figures and is not
run twice for a model; the time phase reads them and times kiln untuned and tuned beside ONNX
Runtime, outputs checked. (Its figures are for the closing note, never asserted.)"""

from __future__ import annotations

import json
import shutil
import sqlite3

import onnx
import pytest

from tests.tune.models import two_layers

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")


def _records(db) -> int:
    with sqlite3.connect(db) as c:
        return c.execute("SELECT COUNT(*) FROM records").fetchone()[0]


def test_tune_then_time_phases(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    from benchmarks import tune_acceptance as ta
    model = tmp_path / "layers.onnx"
    onnx.save(two_layers(), model)
    work = tmp_path / "work"
    common = ["--models", str(model), "--work", str(work)]
    with pytest.raises(SystemExit, match="--phase tune"):   # nothing tuned yet
        ta.main(["--phase", "time", *common])

    ta.main(["--phase", "tune", "--clock", "cpu", "--budget", "3s", "--no-end-to-end", *common])
    tuned = json.loads((work / "layers.tune.json").read_text())
    assert tuned["db"] == str(work / "layers.db") and tuned["clock"] == "cpu"
    assert any(t["weight"] == 2 for t in tuned["tasks"])   # the two same-shaped layers: one task
    assert all(t["default_us"] > 0 for t in tuned["tasks"])
    n = _records(tuned["db"])
    assert n >= 1   # at least a default, measured

    ta.main(["--phase", "tune", "--clock", "cpu", "--budget", "3s", "--no-end-to-end", *common])
    assert "tuned already" in capsys.readouterr().out
    assert _records(tuned["db"]) == n   # a model is tuned once per work directory

    ta.main(["--phase", "time", "--threads", "1", "--seconds", "0.2", *common])
    out = capsys.readouterr().out
    (row,) = json.loads((work / "summary.json").read_text())
    assert row["trials"] == tuned["trials"] and row["bench"]["match"] == {"untuned": True, "tuned": True}
    assert all(row["bench"][k] > 0 for k in ("untuned", "tuned", "ort"))
    assert "| layers.onnx |" not in out and f"| {model} |" in out and "time phase:" in out
