"""ONNX type constraints across a node's inputs: inputs of one type variable share one dtype.

ONNX declares each standard op's inputs with type variables (MatMul(A: T, B: T), Gemm's
A, B, C: T, Conv's X, W, B: T); the inputs of one variable must hold the same element type.
Not every op's inference looks (MatMul, Gemm and Conv took a float64 weight beside a float32
activation and computed in float32: a silently wrong model that ONNX's checker and ONNX
Runtime refuse), so the inferencer checks every node of a standard domain against its
schema at the node's opset (onnx.defs, the spec itself) before the op's own inference, and
kiln.ops.infer.infer_types lists every mismatch of a model at once (DTypeMismatchError).
Heterogeneous variadic inputs (Loop's and Scan's state) carry no such constraint.
"""

from __future__ import annotations

import functools

from kiln.graph.types import TensorType

STANDARD_DOMAINS = ("", "ai.onnx.ml", "ai.onnx.preview.training", "ai.onnx.preview")


@functools.lru_cache(maxsize=None)
def input_variables(domain: str, op: str, opset: int) -> tuple[tuple[str, bool], ...] | None:
    """Per formal input of `op` at `opset`: (its type variable or "", whether it is variadic and
    homogeneous); None when ONNX has no schema for it (kiln's own ops)."""
    if domain not in STANDARD_DOMAINS or opset < 1:
        return None
    import onnx.defs  # noqa: PLC0415 (the spec; imported only when a standard op is inferred)
    try:
        schema = onnx.defs.get_schema(op, opset, domain)
    except onnx.defs.SchemaError:
        return None
    names = {c.type_param_str for c in schema.type_constraints}
    out = []
    for p in schema.inputs:
        variadic = p.option == onnx.defs.OpSchema.FormalParameterOption.Variadic
        var = p.type_str if p.type_str in names and (not variadic or p.is_homogeneous) else ""
        out.append((var, variadic))
    return tuple(out)


def dtype_mismatches(node, opset: int, types: list) -> list[tuple[int, str, object, object, int]]:
    """The inputs of `node` whose dtype differs from the first input of the same type variable:
    (input index, type variable, expected dtype, given dtype, index of the input it must match)."""
    formals = input_variables(node.domain or "", node.op, opset)
    if not formals:
        return []
    first: dict[str, tuple[int, object]] = {}
    out = []
    for i, t in enumerate(types):
        if i < len(formals):
            var = formals[i][0]
        elif formals[-1][1]:     # more inputs of the variadic last one
            var = formals[-1][0]
        else:
            continue             # (too many inputs: check_arity's error)
        if not var or not isinstance(t, TensorType) or t.dtype is None:
            continue
        if var not in first:
            first[var] = (i, t.dtype)
        elif t.dtype != first[var][1]:
            out.append((i, var, first[var][1], t.dtype, first[var][0]))
    return out
