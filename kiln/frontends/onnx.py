"""ONNX ModelProto → kiln Graph.

Initializers become constant values (also when the model lists them as graph
inputs, as pre-IR-4 exporters do). External-data tensors are read from files
confined to the model's folder. Types are then inferred by kiln's own op
definitions; the model's declared output types are only checked.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import numpy_helper

from kiln.dtypes import DType
from kiln.errors import KilnError
from kiln.graph.ir import Graph, Node, Value
from kiln.graph.types import OptionalType, SequenceType, TensorType, Type
from kiln.limits import check_constant, resource_guard
from kiln.names import printable
from kiln.ops.infer import infer_types

_A = onnx.AttributeProto


def read_model(model: str | os.PathLike | bytes | onnx.ModelProto) -> tuple[onnx.ModelProto, str | None]:
    """Parse a model from a path, bytes or proto; returns it with its folder (for external data)."""
    if isinstance(model, onnx.ModelProto):
        return model, None
    if isinstance(model, bytes):
        data, base = model, None
    else:
        path = os.fspath(model)
        if not os.path.isfile(path):
            raise KilnError(f"model file not found: {path}")
        with open(path, "rb") as f:
            data = f.read()
        base = os.path.dirname(os.path.abspath(path))
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise KilnError(f"not a valid ONNX model ({len(data)} bytes): {e}") from None
    if not proto.HasField("graph") or not proto.opset_import:
        raise KilnError(f"not a valid ONNX model ({len(data)} bytes): no graph or no opset_import "
                        "(truncated or not an .onnx file?)")
    return proto, base


# The newest opset of each standard domain whose semantics kiln implements (those of
# onnx 1.23); a newer version may change an op's meaning, so it is refused, not guessed.
SUPPORTED_OPSETS = {"": 28, "ai.onnx.ml": 5, "ai.onnx.preview.training": 1, "ai.onnx.preview": 1}


def load_onnx(model, *, infer: bool = True) -> Graph:
    """Import an ONNX model (path, bytes or ModelProto) as a typed kiln Graph. Its
    `data_files` lists the external-data files read (real paths), which a cache keyed on
    the model file's identity must watch too (kiln.targets.cache.ModelFile)."""
    with resource_guard("onnx import"):
        return _load(model, infer)


def _load(model, infer: bool) -> Graph:
    proto, base = read_model(model)
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in proto.opset_import}
    opsets.setdefault("", 1)
    check_opsets(opsets)
    conv = _Converter(base, opsets)
    graph, declared = conv.graph(proto.graph, scope=None)
    if infer:
        infer_types(graph, declared)
    graph.data_files = list(conv.data_files)
    return graph


def check_opsets(opsets: dict[str, int]) -> None:
    """Refuse an opset of a standard domain outside 1..what kiln implements."""
    for domain, version in opsets.items():
        top = SUPPORTED_OPSETS.get(domain)
        if top is not None and not 1 <= version <= top:
            raise KilnError(f"opset_import: {domain or 'ai.onnx'} version {version} is not supported; "
                            f"kiln implements versions 1 to {top}", stage="onnx import")


class _Scope:
    def __init__(self, parent: "_Scope | None"):
        self.parent = parent
        self.names: dict[str, Value] = {}

    def get(self, name: str) -> Value | None:
        s = self
        while s is not None:
            if name in s.names:
                return s.names[name]
            s = s.parent
        return None


# ai.onnx.ml ops that read or make maps, a type kiln does not have: refused up front, by node
_MAP_OPS = {
    "ZipMap": "it makes a sequence of maps ({class: probability} per row) and kiln has no map type; "
              "export without it and read the probability tensor (skl2onnx: "
              "options={id(model): {'zipmap': False}})",
    "DictVectorizer": "it reads a map and kiln has no map type; vectorize before export and feed a "
                      "dense tensor",
}


def _refuse_map_ops(g: onnx.GraphProto) -> None:
    for n in g.node:
        if n.domain == "ai.onnx.ml" and n.op_type in _MAP_OPS:
            raise KilnError(f"cannot compile: {_MAP_OPS[n.op_type]}", node=n.name or n.op_type, op=n.op_type,
                            stage="onnx import")


class _Converter:
    def __init__(self, base_dir: str | None, opsets: dict[str, int]):
        self.base_dir = base_dir
        self.opsets = opsets
        self.data_files: dict[str, None] = {}   # external data read (real paths, in order)

    def graph(self, g: onnx.GraphProto, scope: _Scope | None) -> tuple[Graph, dict[str, Type]]:
        _refuse_map_ops(g)
        sc = _Scope(scope)
        inits = {t.name: t for t in g.initializer}
        for st in g.sparse_initializer:
            inits[st.values.name] = st
        inputs = []
        for vi in g.input:
            t = self.type(vi.type, vi.name)
            if vi.name in inits:
                v = self.constant(inits.pop(vi.name))
                if t is not None and not _fits(v.type, t):
                    raise KilnError(f"graph input {vi.name!r} is declared as {t} but its "
                                    f"initializer holds {v.type}", stage="onnx import")
                sc.names[vi.name] = v
            else:
                v = Value(vi.name, t)
                sc.names[vi.name] = v
                inputs.append(v)
        for name, t in inits.items():
            sc.names[name] = self.constant(t)
        nodes = []
        for i, n in enumerate(g.node):
            nodes.append(self.node(n, sc, i))
        outputs, declared = [], {}
        for vi in g.output:
            v = sc.get(vi.name)
            if v is None:
                raise KilnError(f"graph output {vi.name!r} is produced by no node, input or "
                                f"initializer", stage="onnx import")
            outputs.append(v)
            t = self.type(vi.type, vi.name)
            if t is not None:
                declared[vi.name] = t
        return Graph(g.name or "main", inputs, outputs, nodes, dict(self.opsets)), declared

    def node(self, n: onnx.NodeProto, sc: _Scope, index: int) -> Node:
        name = n.name or f"{n.op_type}_{index}"
        ins = []
        for j, iname in enumerate(n.input):
            if not iname:
                ins.append(None)
                continue
            v = sc.get(iname)
            if v is None:
                raise KilnError(f"input {j} ({iname!r}) is not produced by any earlier node, "
                                f"graph input or initializer", node=name, op=n.op_type,
                                stage="onnx import")
            ins.append(v)
        attrs = {a.name: self.attr(a, sc, name, n.op_type) for a in n.attribute}
        outs = []
        for oname in n.output:
            if not oname:
                outs.append(None)
                continue
            v = Value(oname, None)
            sc.names[oname] = v
            outs.append(v)
        domain = "" if n.domain == "ai.onnx" else n.domain
        return Node(n.op_type, ins, outs, attrs, name, domain)

    def attr(self, a: onnx.AttributeProto, sc: _Scope, node: str, op: str) -> Any:
        t = a.type
        if t == _A.FLOAT:
            return float(a.f)
        if t == _A.INT:
            return int(a.i)
        if t == _A.STRING:
            return _decode(a.s)
        if t == _A.TENSOR:
            return self.tensor(a.t)
        if t == _A.SPARSE_TENSOR:
            return self.sparse(a.sparse_tensor)
        if t == _A.GRAPH:
            return self.graph(a.g, sc)[0]
        if t == _A.FLOATS:
            return [float(x) for x in a.floats]
        if t == _A.INTS:
            return [int(x) for x in a.ints]
        if t == _A.STRINGS:
            return [_decode(s) for s in a.strings]
        if t == _A.TENSORS:
            return [self.tensor(x) for x in a.tensors]
        if t == _A.GRAPHS:
            return [self.graph(x, sc)[0] for x in a.graphs]
        if t == _A.TYPE_PROTO:
            return self.type(a.tp, a.name)
        if t == _A.TYPE_PROTOS:
            return [self.type(x, a.name) for x in a.type_protos]
        raise KilnError(f"attribute {a.name!r} has unsupported type {t}", node=node, op=op,
                        stage="onnx import")

    def type(self, tp: onnx.TypeProto, what: str) -> Type | None:
        kind = tp.WhichOneof("value")
        if kind is None:
            return None
        if kind == "tensor_type":
            tt = tp.tensor_type
            if tt.elem_type == 0:
                return None
            dtype = DType.from_onnx(tt.elem_type)
            if not tt.HasField("shape"):
                return TensorType(dtype, None)
            dims = []
            for k, d in enumerate(tt.shape.dim):
                if d.HasField("dim_value") and d.dim_value >= 0:
                    dims.append(int(d.dim_value))
                elif d.dim_param:
                    dims.append(d.dim_param)
                else:  # no dim, or a negative one (old exporters' "any size"): a fresh symbol
                    dims.append(f"{what}_dim{k}")
            return TensorType(dtype, tuple(dims))
        if kind == "sequence_type":
            e = self.type(tp.sequence_type.elem_type, what)
            return SequenceType(e) if e is not None else None
        if kind == "optional_type":
            e = self.type(tp.optional_type.elem_type, what)
            return OptionalType(e) if e is not None else None
        raise KilnError(f"value {what!r} has type {kind}, which kiln does not support",
                        stage="onnx import")

    def constant(self, t) -> Value:
        if isinstance(t, onnx.SparseTensorProto):
            return _const(t.values.name, self.sparse(t))
        return _const(t.name, self.tensor(t))

    def tensor(self, t: onnx.TensorProto) -> np.ndarray:
        what = f"tensor {printable(t.name)}"
        dtype = _tensor_dtype(t, what)
        if any(d < 0 for d in t.dims):
            raise KilnError(f"{what} has negative dims {list(t.dims)}", stage="onnx import")
        size = math.prod(t.dims) * (dtype.itemsize if dtype.name != "string" else 1)
        check_constant(size, what, stage="onnx import")
        if t.data_location == onnx.TensorProto.EXTERNAL:
            return self.external(t, dtype)
        try:
            arr = numpy_helper.to_array(t)
        except MemoryError:
            raise
        except Exception as e:
            raise KilnError(f"{what} cannot be read: {e}", stage="onnx import") from None
        if arr.dtype == object:
            arr = np.vectorize(_decode, otypes=[object])(arr) if arr.size else arr
        return arr

    def sparse(self, st: onnx.SparseTensorProto) -> np.ndarray:
        what = f"sparse tensor {printable(st.values.name)}"
        values = self.tensor(st.values)
        idx = self.tensor(st.indices)
        dims = tuple(int(d) for d in st.dims)
        if any(d < 0 for d in dims):
            raise KilnError(f"{what} has negative dims {list(dims)}", stage="onnx import")
        check_constant(math.prod(dims) * values.dtype.itemsize, what, stage="onnx import")
        if values.ndim != 1 or idx.dtype.kind not in "iu" or idx.ndim not in (1, 2) \
                or idx.shape[0] != values.shape[0] or (idx.ndim == 2 and idx.shape[1] != len(dims)):
            raise KilnError(f"{what}: indices of shape {idx.shape} ({idx.dtype}) do not fit "
                            f"{values.shape[0] if values.ndim else '?'} values of a {list(dims)} "
                            "tensor (ONNX wants [NNZ] linear or [NNZ, rank] indices)", stage="onnx import")
        idx = idx.astype(np.int64)
        bound = np.array([math.prod(dims)] if idx.ndim == 1 else dims, dtype=np.int64)
        if idx.size and ((idx < 0).any() or (idx >= bound).any()):
            raise KilnError(f"{what}: an index is outside its {list(dims)} shape", stage="onnx import")
        dense = np.zeros(dims, dtype=values.dtype)
        if idx.ndim == 1:
            dense.reshape(-1)[idx] = values
        else:
            dense[tuple(idx.T)] = values
        return dense

    def external(self, t: onnx.TensorProto, dtype: DType) -> np.ndarray:
        what = f"tensor {printable(t.name)}"
        info = {e.key: e.value for e in t.external_data}
        loc = info.get("location", "")
        if self.base_dir is None:
            raise KilnError(f"{what} keeps its data in external file {printable(loc)}, but the "
                            "model was not loaded from a path", stage="onnx import")
        if not loc or "\0" in loc:
            raise KilnError(f"{what}: external data location {printable(loc)} is empty or holds a "
                            "NUL character", stage="onnx import")
        path = os.path.realpath(os.path.join(self.base_dir, loc))
        base = os.path.realpath(self.base_dir)
        if os.path.isabs(loc) or os.path.commonpath([path, base]) != base:
            raise KilnError(f"{what}: external data path {printable(loc)} escapes the model "
                            f"folder {base}", stage="onnx import")
        if not os.path.isfile(path):
            raise KilnError(f"{what}: external data file {printable(loc)} not found",
                            stage="onnx import")
        self.data_files[path] = None
        count = math.prod(t.dims)
        want = count * dtype.itemsize
        offset = _external_int(info, "offset", 0, what)
        length = _external_int(info, "length", want, what)
        size = os.path.getsize(path)
        if length != want or offset + length > size:
            raise KilnError(f"{what}: external data of {length:,} bytes at offset {offset:,} of "
                            f"{printable(loc)} ({size:,} bytes); the tensor needs {want:,} bytes",
                            stage="onnx import")
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                raw = f.read(length)
        except OSError as e:
            raise KilnError(f"{what}: cannot read external data {printable(loc)}: {e}",
                            stage="onnx import") from None
        if len(raw) != want:
            raise KilnError(f"{what}: external data holds {len(raw)} bytes, expected {want}",
                            stage="onnx import")
        return np.frombuffer(raw, dtype=dtype.np).reshape(tuple(t.dims)).copy()


def _tensor_dtype(t: onnx.TensorProto, what: str) -> DType:
    try:
        return DType.from_onnx(t.data_type)
    except KilnError as e:
        raise KilnError(f"{what}: {e}", stage="onnx import") from None


def _external_int(info: dict, key: str, default: int, what: str) -> int:
    """A non-negative integer field of external_data (offset, length)."""
    text = info.get(key)
    if text is None:
        return default
    if not text.isdigit() or len(text) > 19 or int(text) >= 1 << 62:
        raise KilnError(f"{what}: external data {key} {printable(text)} is not a non-negative "
                        "integer below 2^62", stage="onnx import")
    return int(text)


def _const(name: str, data: np.ndarray) -> Value:
    return Value(name, TensorType(DType.from_numpy(data.dtype), tuple(data.shape)), data)


def _fits(got: Type, declared: Type) -> bool:
    if isinstance(got, TensorType) and isinstance(declared, TensorType):
        if got.dtype != declared.dtype:
            return False
        if declared.shape is None:
            return True
        return len(got.shape) == len(declared.shape) and all(
            isinstance(d, str) or d == g for g, d in zip(got.shape, declared.shape))
    return True


def _decode(s):
    return s.decode("utf-8", errors="surrogateescape") if isinstance(s, bytes) else s
