"""Shared test helpers: small models built in code (nothing downloaded)."""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))

from build_example import build_small_cnn  # noqa: E402


def small_cnn_model(batch=1):
    return build_small_cnn(seed=0, batch=batch)
