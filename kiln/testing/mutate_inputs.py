"""The mutation fuzzer's mutations (kiln.testing.mutate): a valid model or artifact broken on
purpose, the way an attacker or a buggy exporter would.

- models (`mutate_model`): attribute values, types and presence, declared input dims and
  dtypes, initializers, op types, inputs, outputs, domains, opsets, names, and the run-time
  feeds;
- artifacts (`mutate_artifact`): manifest fields, zip members and the zip itself.
"""

from __future__ import annotations

import copy
import json
import zipfile
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from kiln.testing.mutate_seeds import Seed


A = onnx.AttributeProto
INTERESTING_INTS = [0, 1, -1, 2, 3, -2, 7, 255, 256, 65535, 2 ** 31 - 1, -2 ** 31, 2 ** 32, 10 ** 6,
                    10 ** 12, 2 ** 62, 2 ** 63 - 1, -2 ** 63]
INTERESTING_FLOATS = [0.0, -0.0, 1.0, -1.0, 0.5, 1e-38, 1e38, -1e38, float("inf"), float("-inf"), float("nan"),
                      3.4e38, 1e300]
CONTROL = ["\x1b[2J", "\x1b]0;pwned\x07", "\n", "\r", "\x00", "\u202e", "\x7f", "%s%n", "'\"`;$(id)"]
DTYPES = [T.FLOAT, T.UINT8, T.INT8, T.UINT16, T.INT16, T.INT32, T.INT64, T.STRING, T.BOOL, T.FLOAT16,
          T.DOUBLE, T.UINT32, T.UINT64, T.COMPLEX64, T.BFLOAT16, T.FLOAT8E4M3FN, T.INT4, 0, 99]
ATTR_NAMES = ["axis", "axes", "perm", "kernel_shape", "pads", "strides", "dilations", "group", "to", "keepdims",
              "mode", "alpha", "beta", "epsilon", "transA", "transB", "num_outputs", "split", "batch_dims",
              "reduction", "direction", "hidden_size", "blocksize", "k", "largest", "sorted", "value", "seed",
              "allowzero", "coordinate_transformation_mode", "auto_pad", "ceil_mode", "count_include_pad"]


# ---------------------------------------------------------------- model mutations

def _graphs(g: onnx.GraphProto):
    """The graph and every subgraph in it."""
    yield g
    for n in g.node:
        for a in n.attribute:
            if a.type == A.GRAPH:
                yield from _graphs(a.g)
            elif a.type == A.GRAPHS:
                for s in a.graphs:
                    yield from _graphs(s)


def _nodes(m: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for g in _graphs(m.graph) for n in g.node]


def _pick(rng, seq):
    return seq[int(rng.integers(len(seq)))] if len(seq) else None


def _int(rng) -> int:
    return int(_pick(rng, INTERESTING_INTS)) if rng.random() < 0.7 else int(rng.integers(-8, 9))


def _float(rng) -> float:
    return float(_pick(rng, INTERESTING_FLOATS)) if rng.random() < 0.7 else float(rng.normal() * 4)


def _value_names(m: onnx.ModelProto) -> list[str]:
    names = [v.name for v in m.graph.input] + [t.name for t in m.graph.initializer]
    return names + [o for n in _nodes(m) for o in n.output if o]


def m_attr_value(m, rng, feeds) -> str:
    nodes = [n for n in _nodes(m) if n.attribute]
    n = _pick(rng, nodes)
    if n is None:
        return m_attr_add(m, rng, feeds)
    a = _pick(rng, n.attribute)
    if a.type == A.INT:
        a.i = _int(rng)
    elif a.type == A.FLOAT:
        a.f = _float(rng)
    elif a.type == A.INTS:
        vals = list(a.ints) or [0]
        k = int(rng.integers(4))
        if k == 0:
            vals[int(rng.integers(len(vals)))] = _int(rng)
        elif k == 1:
            vals = vals[:-1]
        elif k == 2:
            vals.append(_int(rng))
        else:
            vals = [_int(rng) for _ in range(int(rng.integers(0, 9)))]
        del a.ints[:]
        a.ints.extend(vals)
    elif a.type == A.FLOATS:
        vals = list(a.floats) or [0.0]
        vals[int(rng.integers(len(vals)))] = _float(rng)
        del a.floats[:]
        a.floats.extend(vals)
    elif a.type == A.STRING:
        a.s = _pick(rng, [b"", b"bogus", b"NOTSET", b"reflect", b"linear", b"\xff\xfe",
                          _pick(rng, CONTROL).encode()])
    elif a.type == A.TENSOR:
        _mutate_tensor(a.t, rng)
    else:
        n.attribute.remove(a)
        return f"attr_drop {n.op_type}.{a.name}"
    return f"attr_value {n.op_type}.{a.name}"


def m_attr_add(m, rng, feeds) -> str:
    n = _pick(rng, _nodes(m))
    if n is None:
        return "noop"
    name = _pick(rng, ATTR_NAMES)
    for a in list(n.attribute):
        if a.name == name:
            n.attribute.remove(a)
    kind = int(rng.integers(4))
    value = (_int(rng) if kind == 0 else _float(rng) if kind == 1 else
             [_int(rng) for _ in range(int(rng.integers(0, 6)))] if kind == 2 else "bogus")
    n.attribute.append(h.make_attribute(name, value) if kind != 2 or value else
                       h.make_attribute(name, [], attr_type=A.INTS))
    return f"attr_add {n.op_type}.{name}"


def m_attr_retype(m, rng, feeds) -> str:
    """An attribute of the right name and the wrong type (INT where INTS is wanted, ...)."""
    nodes = [n for n in _nodes(m) if n.attribute]
    n = _pick(rng, nodes)
    if n is None:
        return "noop"
    a = _pick(rng, n.attribute)
    name = a.name
    n.attribute.remove(a)
    n.attribute.append(h.make_attribute(name, _pick(rng, [1, 1.5, [1, 2], [1.0], "x", b"y"])))
    return f"attr_retype {n.op_type}.{name}"


def m_input_dims(m, rng, feeds) -> str:
    vi = _pick(rng, list(m.graph.input))
    if vi is None or not vi.type.HasField("tensor_type"):
        return "noop"
    tt = vi.type.tensor_type
    dims = tt.shape.dim
    k = int(rng.integers(5))
    if k == 0 and len(dims):
        dims[int(rng.integers(len(dims)))].dim_value = _pick(rng, [0, 1, 2, 3, 5, 2 ** 20, 2 ** 40, 2 ** 62])
    elif k == 1 and len(dims):
        dims[int(rng.integers(len(dims)))].dim_param = _pick(rng, ["n", "batch", "\x1b[2J", ""])
    elif k == 2:
        tt.shape.dim.add().dim_value = int(rng.integers(1, 4))
    elif k == 3 and len(dims):
        del dims[-1]
    else:
        tt.ClearField("shape")
    _reshape_feed(feeds, vi.name, rng)
    return f"input_dims {vi.name}"


def m_input_dtype(m, rng, feeds) -> str:
    vi = _pick(rng, list(m.graph.input))
    if vi is None or not vi.type.HasField("tensor_type"):
        return "noop"
    vi.type.tensor_type.elem_type = int(_pick(rng, DTYPES))
    if vi.name in feeds and rng.random() < 0.5:
        feeds.pop(vi.name)  # let the harness make values of the new dtype
    return f"input_dtype {vi.name}"


def _mutate_tensor(t: onnx.TensorProto, rng) -> str:
    k = int(rng.integers(5))
    if k == 0 and len(t.dims):  # dims that no longer match the data
        t.dims[int(rng.integers(len(t.dims)))] = _pick(rng, [0, 1, 2, 7, 2 ** 31, 2 ** 40, -1])
        return "dims"
    if k == 1:
        t.data_type = int(_pick(rng, DTYPES))
        return "dtype"
    if k == 2 and t.raw_data:
        t.raw_data = t.raw_data[:int(rng.integers(len(t.raw_data)))]
        return "truncated"
    try:
        arr = numpy_helper.to_array(t)
    except Exception:  # noqa: BLE001 - already broken: break it more
        t.ClearField("raw_data")
        return "cleared"
    if arr.dtype.kind in "iu" and arr.size:
        flat = arr.reshape(-1).copy()
        info = np.iinfo(arr.dtype)
        flat[int(rng.integers(flat.size))] = np.clip(_int(rng), info.min, info.max)
        arr = flat.reshape(arr.shape)
    elif arr.dtype.kind == "f" and arr.size:
        flat = arr.reshape(-1).copy()
        with np.errstate(all="ignore"):
            flat[int(rng.integers(flat.size))] = _float(rng)
        arr = flat.reshape(arr.shape)
    elif k == 4:
        arr = np.zeros([int(rng.integers(0, 3)) for _ in range(int(rng.integers(0, 3)))], arr.dtype)
    new = numpy_helper.from_array(arr, t.name)
    t.CopyFrom(new)
    return "values"


def m_initializer(m, rng, feeds) -> str:
    inits = [t for g in _graphs(m.graph) for t in g.initializer]
    inits += [a.t for n in _nodes(m) for a in n.attribute if a.type == A.TENSOR]
    t = _pick(rng, inits)
    if t is None:
        return m_attr_value(m, rng, feeds)
    return f"initializer {_mutate_tensor(t, rng)} {t.name}"


def _ops() -> list[str]:
    from kiln.ops.registry import REGISTRY
    return sorted(name for d, name in REGISTRY if d == "")


def m_op_swap(m, rng, feeds) -> str:
    n = _pick(rng, _nodes(m))
    if n is None:
        return "noop"
    old, n.op_type = n.op_type, _pick(rng, _ops() + ["NoSuchOp"])
    return f"op_swap {old}->{n.op_type}"


def m_drop_input(m, rng, feeds) -> str:
    n = _pick(rng, [n for n in _nodes(m) if n.input])
    if n is None:
        return "noop"
    k = int(rng.integers(len(n.input)))
    if rng.random() < 0.5:
        del n.input[k]
        return f"drop_input {n.op_type}[{k}]"
    n.input[k] = ""
    return f"blank_input {n.op_type}[{k}]"


def m_rewire_input(m, rng, feeds) -> str:
    """An input read from another value (type confusion), an unknown name, or one more input."""
    n = _pick(rng, _nodes(m))
    if n is None:
        return "noop"
    names = _value_names(m) + ["no_such_value"]
    if n.input and rng.random() < 0.6:
        k = int(rng.integers(len(n.input)))
        n.input[k] = _pick(rng, names)
        return f"rewire_input {n.op_type}[{k}]"
    n.input.append(_pick(rng, names))
    return f"extra_input {n.op_type}"


def m_outputs(m, rng, feeds) -> str:
    k = int(rng.integers(4))
    if k == 0 and len(m.graph.output) > 1:
        del m.graph.output[int(rng.integers(len(m.graph.output)))]
        return "drop_graph_output"
    if k == 1:
        name = _pick(rng, _value_names(m))
        m.graph.output.append(h.make_tensor_value_info(name, int(_pick(rng, DTYPES[:12])), None))
        return f"add_graph_output {name}"
    n = _pick(rng, _nodes(m))
    if n is None:
        return "noop"
    if k == 2 and n.output:
        del n.output[-1]
        return f"drop_output {n.op_type}"
    n.output.append(f"extra_{int(rng.integers(100))}")
    return f"extra_output {n.op_type}"


def m_opset(m, rng, feeds) -> str:
    m.opset_import[0].version = int(_pick(rng, [1, 5, 6, 7, 9, 10, 11, 12, 13, 16, 18, 21, 23, 28, 29, 999, 0]))
    return f"opset {m.opset_import[0].version}"


def m_domain(m, rng, feeds) -> str:
    n = _pick(rng, _nodes(m))
    if n is None:
        return "noop"
    n.domain = _pick(rng, ["ai.onnx.ml", "com.microsoft", "kiln", "ai.onnx", "x\x1b"])
    return f"domain {n.op_type}"


def m_names(m, rng, feeds) -> str:
    """Control characters in node, graph and value names (a value renamed consistently)."""
    weird = "v" + _pick(rng, CONTROL) + str(int(rng.integers(100)))
    k = int(rng.integers(3))
    if k == 0:
        m.graph.name = weird
        return "graph_name"
    if k == 1:
        n = _pick(rng, _nodes(m))
        if n is not None:
            n.name = weird
        return "node_name"
    names = _value_names(m)
    old = _pick(rng, names)
    if not old:
        return "noop"
    for g in _graphs(m.graph):
        for coll in (g.input, g.output, g.value_info):
            for v in coll:
                if v.name == old:
                    v.name = weird
        for t in g.initializer:
            if t.name == old:
                t.name = weird
        for n in g.node:
            for seq in (n.input, n.output):
                for i, x in enumerate(seq):
                    if x == old:
                        seq[i] = weird
    if old in feeds:
        feeds[weird] = feeds.pop(old)
    return "value_name"


def m_feeds(m, rng, feeds) -> str:
    """The run-time inputs: extreme values (huge or negative indices, NaN), other shapes or dtypes."""
    if not feeds:
        return m_attr_value(m, rng, feeds)
    name = _pick(rng, sorted(feeds))
    x = np.array(feeds[name])
    k = int(rng.integers(4))
    if k == 0 and x.size:
        flat = x.reshape(-1).copy()
        if x.dtype.kind in "iu":
            info = np.iinfo(x.dtype)
            flat[int(rng.integers(flat.size))] = np.clip(_int(rng), info.min, info.max)
        elif x.dtype.kind == "f":
            flat[int(rng.integers(flat.size))] = _float(rng)
        feeds[name] = flat.reshape(x.shape)
    elif k == 1:
        _reshape_feed(feeds, name, rng)
    elif k == 2:
        feeds[name] = x.astype(_pick(rng, [np.float64, np.int32, np.int64, np.float16, np.bool_, np.uint8]))
    else:
        feeds[name] = np.full(x.shape, _int(rng) if x.dtype.kind in "iu" else _float(rng)).astype(x.dtype)
    return f"feeds {name}"


def _reshape_feed(feeds, name, rng) -> None:
    x = feeds.get(name)
    if x is None:
        return
    shape = list(np.shape(x))
    k = int(rng.integers(3))
    if k == 0 and shape:
        shape[int(rng.integers(len(shape)))] = int(rng.integers(0, 7))
    elif k == 1:
        shape.append(int(rng.integers(1, 3)))
    elif shape:
        shape.pop()
    size = int(np.prod(shape)) if shape else 1
    flat = np.resize(np.asarray(x).reshape(-1), size) if np.size(x) else np.zeros(size, np.asarray(x).dtype)
    feeds[name] = flat.reshape(shape)


MODEL_MUTATORS: list[tuple[str, Callable]] = [
    ("attr_value", m_attr_value), ("attr_value", m_attr_value), ("attr_add", m_attr_add),
    ("attr_retype", m_attr_retype), ("input_dims", m_input_dims), ("input_dtype", m_input_dtype),
    ("initializer", m_initializer), ("initializer", m_initializer), ("op_swap", m_op_swap),
    ("drop_input", m_drop_input), ("rewire_input", m_rewire_input), ("outputs", m_outputs),
    ("opset", m_opset), ("domain", m_domain), ("names", m_names), ("feeds", m_feeds), ("feeds", m_feeds),
]


def mutate_model(seed: Seed, rng: np.random.Generator) -> tuple[bytes, dict, list[str]]:
    """One to three stacked mutations of `seed`: (model bytes, run-time feeds, what was done)."""
    m = copy.deepcopy(seed.model)
    feeds = {k: np.array(v) for k, v in seed.feeds.items()}
    done = []
    for _ in range(1 + int(rng.integers(3) if rng.random() < 0.4 else 0)):
        _, fn = MODEL_MUTATORS[int(rng.integers(len(MODEL_MUTATORS)))]
        try:
            done.append(fn(m, rng, feeds))
        except (ValueError, TypeError, OverflowError) as e:  # protobuf refused the value itself
            done.append(f"(mutation refused: {type(e).__name__})")
    try:
        data = m.SerializeToString()
    except Exception:  # noqa: BLE001 - an unserialisable mutation: keep the seed
        data, done = seed.model.SerializeToString(), done + ["(unserialisable: seed kept)"]
    return data, feeds, done


# ---------------------------------------------------------------- artifact mutations

def _json_paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _json_paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _json_paths(v, prefix + (i,))


def _mutate_json(manifest: dict, rng) -> str:
    paths = [p for p in _json_paths(manifest) if p]
    path = _pick(rng, paths)
    parent = manifest
    for k in path[:-1]:
        parent = parent[k]
    key, old = path[-1], parent[path[-1]]
    k = int(rng.integers(5))
    if k == 0:
        if isinstance(parent, dict):
            del parent[key]
        else:
            parent.pop(key)
        return f"manifest delete {'.'.join(map(str, path))}"
    if isinstance(old, bool) or k == 1:
        parent[key] = _pick(rng, [None, "", [], {}, 0, -1, "x", True, 1.5])
    elif isinstance(old, int):
        parent[key] = _pick(rng, [0, 1, -1, old // 2, old * 2, old + 64, 2 ** 31, 2 ** 63, -2 ** 63, 10 ** 30])
    elif isinstance(old, str):
        parent[key] = _pick(rng, ["", "system", "main", "../../lib.so", "model.h", "float64", "int8", "unknown",
                                  old[:-1], old + "_", "kiln_main", "\x1b[2J", "cpu", "aarch64", "0" * 64])
    elif isinstance(old, list):
        parent[key] = _pick(rng, [[], old[:-1], old + old[-1:], [old[0]] if old else [0], [-1], [2 ** 40]])
    elif isinstance(old, dict):
        parent[key] = _pick(rng, [{}, [], "x"])
    return f"manifest set {'.'.join(map(str, path))}"


def mutate_artifact(data: bytes, rng: np.random.Generator) -> tuple[bytes, list[str]]:
    """A mutated copy of a `.kiln` zip: manifest fields, members truncated/garbled/dropped/added,
    or the zip itself cut or flipped."""
    import io
    k = int(rng.integers(10))
    if k == 0:
        cut = int(rng.integers(len(data)))
        return data[:cut], [f"zip truncated at {cut}"]
    if k == 1:
        b = bytearray(data)
        for _ in range(int(rng.integers(1, 8))):
            b[int(rng.integers(len(b)))] = int(rng.integers(256))
        return bytes(b), ["zip bytes flipped"]
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        members = {n: z.read(n) for n in z.namelist()}
    done = []
    if k <= 5:
        manifest = json.loads(members["manifest.json"])
        for _ in range(1 + int(rng.integers(2))):
            if isinstance(manifest, dict) and manifest:
                done.append(_mutate_json(manifest, rng))
        members["manifest.json"] = json.dumps(manifest).encode()
    else:
        name = _pick(rng, sorted(members))
        body = members[name]
        if k == 6:
            members[name] = body[:int(rng.integers(len(body) + 1))]
            done.append(f"member {name} truncated")
        elif k == 7:
            b = bytearray(body)
            for _ in range(int(rng.integers(1, 16))):
                if b:
                    b[int(rng.integers(len(b)))] = int(rng.integers(256))
            members[name] = bytes(b)
            done.append(f"member {name} garbled")
        elif k == 8:
            del members[name]
            done.append(f"member {name} dropped")
        else:
            other = _pick(rng, sorted(set(members) - {name})) or name
            members[name] = members[other]
            done.append(f"member {name} replaced by {other}")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, body in members.items():
            z.writestr(name, body)
    return buf.getvalue(), done
