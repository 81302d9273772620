"""Shared test helpers: small models built in code (nothing downloaded)."""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))

from build_example import build_small_cnn


def small_cnn_model(batch=1):
    return build_small_cnn(seed=0, batch=batch)


def forks(c_text: str) -> bool:
    """Whether generated C forks a parallel loop: OpenMP's `omp parallel` or a call of kiln's
    pool on an outlined loop (KILN_THREADS_IMPL, kiln.runtime.threads)."""
    import re

    from kiln.codegen.csource import c_source
    c_text = c_text.replace(c_source("kiln_par.h"), "")   # (its OpenMP branch: no fork of its own)
    return "omp parallel" in c_text or re.search(r"kiln_pool_for\(\w+_par\d+, ", c_text) is not None


def examples(full: int, fast: int = 3):
    """A property test's example counts: `fast` examples in the default suite (each one compiles
    a native module, seconds on CI's 2 cores), all `full` under `-m slow`. The test takes
    `examples` and runs its @given check with settings(max_examples=examples)."""
    import pytest
    return pytest.mark.parametrize("examples", [fast, pytest.param(full, marks=pytest.mark.slow)],
                                   ids=["fast", "full"])


def property_test(full: int, fast: int = 3, settings: dict | None = None, **strategies):
    """A property check as a test of `examples` (above): `check` runs under
    @given(**strategies) with `fast` examples in the default suite, all `full` under -m slow."""
    from hypothesis import given
    from hypothesis import settings as hsettings

    def wrap(check):
        @examples(full, fast)
        def test(examples):
            hsettings(max_examples=examples, **(settings or {}))(given(**strategies)(check))()
        test.__name__, test.__qualname__, test.__doc__ = check.__name__, check.__qualname__, check.__doc__
        test.__module__ = check.__module__
        return test
    return wrap


def matmul_corpus_row(directory, width: int, cases: list[dict], name: str = "mm") -> None:
    """A corpus model `name` in `directory` (its .onnx and .json, as `python -m benchmarks.corpus
    build` writes them): x [batch, width] @ w, Relu; for the benchmark scripts' tests (with
    KILN_CORPUS_DIR set to `directory`)."""
    import json

    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    w = np.random.default_rng(0).standard_normal((width, width)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
                          "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])],
                          [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), os.path.join(directory, name + ".onnx"))
    meta = {"name": name, "family": "small", "inputs": [{"name": "x", "shape": ["batch", width], "dtype": "float32",
                                                          "low": 0, "high": 2}], "cases": cases}
    with open(os.path.join(directory, name + ".json"), "w") as f:
        json.dump(meta, f)
