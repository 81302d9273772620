"""The ONNX backend test suite as plain data: node cases and on-disk model cases.

Node cases are built by the installed onnx package at collection time (onnx
1.23 ships them as code, not files); model cases are read from the package's
`backend/test/data` folders. Nothing is downloaded or committed.
"""

from __future__ import annotations

import glob
import os
import warnings
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

import numpy as np
import onnx
from onnx import numpy_helper

DATA_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
MODEL_KINDS = ("simple", "real", "pytorch-converted", "pytorch-operator")


@dataclass
class Case:
    name: str
    kind: str
    load: Callable[[], tuple[onnx.ModelProto, list[tuple[list, list]]]]
    rtol: float = 1e-3
    atol: float = 1e-7


@lru_cache(maxsize=1)
def node_cases() -> list[Case]:
    from onnx.backend.test.case.node import collect_testcases
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases(None)
    return [Case(c.name, "node", (lambda c=c: (c.model, c.data_sets)), c.rtol, c.atol) for c in cases]


def model_cases() -> list[Case]:
    import json
    out = []
    for kind in MODEL_KINDS:
        for d in sorted(glob.glob(os.path.join(DATA_DIR, kind, "test_*"))):
            rtol, atol = 1e-3, 1e-7
            meta = os.path.join(d, "data.json")
            if os.path.exists(meta):
                with open(meta) as f:
                    data = json.load(f)
                rtol, atol = data.get("rtol", rtol), data.get("atol", atol)
            if os.path.exists(os.path.join(d, "model.onnx")):
                out.append(Case(os.path.basename(d), kind, (lambda d=d: _load_dir_case(d)), rtol, atol))
            elif os.path.exists(meta) and "light/" in data.get("url", ""):
                path = os.path.join(DATA_DIR, "light", os.path.basename(data["url"]))
                out.append(Case(os.path.basename(d), kind, (lambda p=path: _load_light_case(p)),
                                rtol, atol))
    return out


def _load_proto(path: str, tp: onnx.TypeProto) -> Any:
    with open(path, "rb") as f:
        raw = f.read()
    if tp.HasField("sequence_type"):
        s = onnx.SequenceProto()
        s.ParseFromString(raw)
        return numpy_helper.to_list(s)
    if tp.HasField("optional_type"):
        o = onnx.OptionalProto()
        o.ParseFromString(raw)
        return numpy_helper.to_optional(o)
    t = onnx.TensorProto()
    t.ParseFromString(raw)
    return numpy_helper.to_array(t)


def _load_dir_case(d: str):
    model = onnx.load(os.path.join(d, "model.onnx"))
    sets = []
    for sd in sorted(glob.glob(os.path.join(d, "test_data_set*"))):
        n_in = len(glob.glob(os.path.join(sd, "input_*.pb")))
        n_out = len(glob.glob(os.path.join(sd, "output_*.pb")))
        ins = [_load_proto(os.path.join(sd, f"input_{i}.pb"), model.graph.input[i].type)
               for i in range(n_in)]
        outs = [_load_proto(os.path.join(sd, f"output_{i}.pb"), model.graph.output[i].type)
                for i in range(n_out)]
        sets.append((ins, outs))
    return model, sets


def _load_light_case(path: str):
    """As onnx's runner does: deterministic ramp inputs, stored reference outputs."""
    model = onnx.load(path)
    inits = {i.name for i in model.graph.initializer}
    ins = []
    for x in model.graph.input:
        if x.name in inits:
            continue
        shape = tuple(d.dim_value if d.HasField("dim_value") else 1
                      for d in x.type.tensor_type.shape.dim)
        n = int(np.prod(shape))
        ins.append((np.arange(n).reshape(shape) / n).astype(np.float32))
    prefix = os.path.splitext(path)[0]
    outs = [_load_proto(f"{prefix}_output_{i}.pb", model.graph.output[i].type)
            for i in range(len(model.graph.output))]
    return model, [(ins, outs)]


def normalize(x: Any) -> Any:
    if isinstance(x, onnx.TensorProto):
        return numpy_helper.to_array(x)
    if isinstance(x, list):
        return [normalize(e) for e in x]
    return x


def assert_similar(ref: list, out: list, rtol: float, atol: float) -> None:
    """Compare as onnx's own runner does: count, then per output shape, dtype, values."""
    np.testing.assert_equal(len(out), len(ref), err_msg="number of outputs")
    for i, (r, o) in enumerate(zip(ref, out)):
        if isinstance(r, (list, tuple)):
            assert isinstance(o, (list, tuple)), f"output {i}: expected a sequence, got {type(o)}"
            assert_similar(list(r), list(o), rtol, atol)
            continue
        if r is None:
            assert o is None, f"output {i}: expected an empty optional"
            continue
        assert isinstance(o, np.ndarray), f"output {i}: expected an array, got {type(o).__name__}"
        np.testing.assert_array_equal(o.shape, r.shape, err_msg=f"output {i} has incorrect shape")
        if r.dtype == object:
            np.testing.assert_array_equal(o, r)
            continue
        np.testing.assert_equal(o.dtype, r.dtype, err_msg=f"output {i} dtype")
        rt = rtol
        if o.dtype.name == "bfloat16":
            rt = max(rtol, 2 ** -6)
            o, r = o.astype(np.float32), r.astype(np.float32)
        np.testing.assert_allclose(o, r, rtol=rt, atol=atol, err_msg=f"output {i}")
