"""Without torch installed, the torch peer is a clear KilnError (kiln bench skips it), not a crash."""

from __future__ import annotations

import subprocess
import sys

import onnx

from tests.runtime.models import elementwise_model

ROOT = __file__.rsplit("/tests/", 1)[0]


def test_missing_torch_is_a_clear_error(tmp_path):
    onnx.save(elementwise_model(batch=2), tmp_path / "m.onnx")
    script = f"""
import sys
sys.modules["torch"] = None  # as if torch were not installed
from kiln.bench import peer
from kiln.errors import KilnError
try:
    peer("torch", {str(tmp_path / "m.onnx")!r}, 1)
except KilnError as e:
    print(e)
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert 'needs PyTorch: pip install -e ".[torch]"' in r.stdout
