"""Shared test helpers: small models built in code (nothing downloaded)."""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))

from build_example import build_small_cnn  # noqa: E402


def small_cnn_model(batch=1):
    return build_small_cnn(seed=0, batch=batch)


def forks(c_text: str) -> bool:
    """Whether generated C forks a parallel loop: OpenMP's `omp parallel` or a call of kiln's
    pool on an outlined loop (KILN_THREADS_IMPL, kiln.runtime.threads)."""
    import re

    from kiln.codegen.csource import c_source
    c_text = c_text.replace(c_source("kiln_par.h"), "")   # (its OpenMP branch: no fork of its own)
    return "omp parallel" in c_text or re.search(r"kiln_pool_for\(\w+_par\d+, ", c_text) is not None
