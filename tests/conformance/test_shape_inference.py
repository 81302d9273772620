"""Cross-check kiln's own type/shape inference against onnx.shape_inference.

kiln never uses onnx's inference; this test only compares the two on every
node test case: where onnx knows a static dtype/shape for a value, kiln must
agree (a kiln symbol may stand for a size onnx knows, but never a different int).
"""

from __future__ import annotations

import warnings

import onnx
import pytest

import kiln
from kiln.graph.types import TensorType
from tests.conformance.cases import node_cases


def _onnx_types(model: onnx.ModelProto) -> dict[str, tuple[int, tuple | None]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    out = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
        if tt is None or tt.elem_type == 0:
            continue
        shape = None
        if tt.HasField("shape"):
            shape = tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim)
        out[vi.name] = (tt.elem_type, shape)
    return out


def _disagreements(case) -> tuple[list[str], int]:
    """(disagreements, number of values compared) for one case."""
    model, _ = case.load()
    try:
        theirs = _onnx_types(model)
    except Exception:  # onnx cannot infer this model: nothing to compare
        return [], 0
    try:
        graph = kiln.load_onnx(model)
    except kiln.KilnError:
        return [], 0  # reported by the conformance test itself
    bad, compared = [], 0
    for _, node in graph.walk():
        for v in node.outputs:
            if v is None or v.name not in theirs or not isinstance(v.type, TensorType):
                continue
            code, shape = theirs[v.name]
            compared += 1
            if v.type.dtype.onnx != code:
                bad.append(f"{v.name}: kiln {v.type}, onnx dtype code {code}")
            elif shape is not None and v.type.shape is not None and (
                    len(shape) != len(v.type.shape) or any(
                        isinstance(k, int) and o is not None and k != o
                        for k, o in zip(v.type.shape, shape))):
                bad.append(f"{v.name}: kiln {v.type}, onnx shape {shape}")
    return bad, compared


def test_kiln_inference_agrees_with_onnx():
    failures, total = {}, 0
    for case in node_cases():
        bad, compared = _disagreements(case)
        total += compared
        if bad:
            failures[case.name] = bad
    assert total > 5000, f"only {total} values compared: the cross-check is not exercising kiln"
    assert not failures, "\n".join(f"{k}: {v}" for k, v in sorted(failures.items()))
