"""Shrink a failing model to a minimal one that fails the same way, and save it as a regression.

Delta debugging over nodes (Zeller's ddmin, on chunks of halving size, then single nodes):

- cut: remove nodes, their outputs that others read becoming graph inputs fed with the values
  the reference computed for them (so the data that triggered the failure is kept);
- truncate: make a node's outputs the graph's only outputs (everything after it is dead);
- bypass: remove a node, its readers reading one of its inputs of the same type instead;
- drop graph outputs, dead nodes, unused inputs and initializers; make symbolic dims static.

A candidate is kept when `still_fails(model, feeds)` holds: the caller checks that the
failure keeps its signature (kiln.testing.differential.Finding.signature).
"""

from __future__ import annotations

import hashlib
import os
from typing import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from kiln.testing.fuzz_builder import _NP

Predicate = Callable[[onnx.ModelProto, dict], bool]


def intermediate_values(model: onnx.ModelProto, feeds: dict) -> dict:
    """Every node output's value by the reference (kiln's interpreter at -O0); {} if it fails."""
    import kiln  # noqa: PLC0415
    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    for n in m.graph.node:
        for o in n.output:
            if o and o not in have:
                m.graph.output.append(onnx.ValueInfoProto(name=o))
                have.add(o)
    try:
        return dict(kiln.compile(m, target="interpreter", opt_level=0).run(feeds))
    except Exception:  # noqa: BLE001
        return {}


class _Graph:
    """A model as editable lists (nodes in order, inputs, initializers, output names, feeds)."""

    def __init__(self, model: onnx.ModelProto, feeds: dict):
        self.model = model
        g = model.graph
        self.nodes = list(g.node)
        self.inputs = list(g.input)
        self.inits = list(g.initializer)
        self.outputs = list(g.output)
        self.feeds = dict(feeds)

    def copy(self) -> "_Graph":
        c = _Graph.__new__(_Graph)
        c.model, c.nodes, c.inputs = self.model, list(self.nodes), list(self.inputs)
        c.inits, c.outputs, c.feeds = list(self.inits), list(self.outputs), dict(self.feeds)
        return c

    def build(self) -> onnx.ModelProto:
        m = onnx.ModelProto()
        m.CopyFrom(self.model)
        g = m.graph
        for part, items in ((g.node, self.nodes), (g.input, self.inputs), (g.initializer, self.inits),
                            (g.output, self.outputs)):
            del part[:]
            part.extend(items)
        del g.value_info[:]
        return m

    def prune(self) -> "_Graph":
        """Drop dead nodes, then inputs and initializers nobody reads."""
        live = {o.name for o in self.outputs}
        keep = []
        for n in reversed(self.nodes):
            if any(o in live for o in n.output):
                keep.append(n)
                live.update(i for i in n.input if i)
                live.update(_subgraph_reads(n))
        self.nodes = keep[::-1]
        self.inputs = [i for i in self.inputs if i.name in live]
        self.inits = [t for t in self.inits if t.name in live]
        self.feeds = {k: v for k, v in self.feeds.items() if k in live}
        return self


def _subgraph_reads(n) -> set:
    """Names a node's subgraphs (If/Loop bodies) read, outer-scope values among them."""
    out = set()
    for a in n.attribute:
        for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
            for sn in g.node:
                out.update(i for i in sn.input if i)
                out |= _subgraph_reads(sn)
    return out


def _value_info(name: str, arr: np.ndarray) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, _NP[arr.dtype], list(arr.shape))


def _out_info(name: str, values: dict) -> onnx.ValueInfoProto:
    x = values.get(name)
    if isinstance(x, np.ndarray) and x.dtype in _NP:
        return _value_info(name, x)
    return onnx.ValueInfoProto(name=name)


def _cut(g: _Graph, idx: set, values: dict) -> _Graph | None:
    """Nodes `idx` removed; their outputs read elsewhere become inputs fed with their values."""
    c = g.copy()
    removed = [n for k, n in enumerate(g.nodes) if k in idx]
    c.nodes = [n for k, n in enumerate(g.nodes) if k not in idx]
    read = {i for n in c.nodes for i in n.input} | {o.name for o in c.outputs}
    for n in c.nodes:
        read |= _subgraph_reads(n)
    for n in removed:
        for o in n.output:
            if o and o in read:
                if o not in values or not isinstance(values[o], np.ndarray) or values[o].dtype not in _NP:
                    return None
                c.inputs.append(_value_info(o, values[o]))
                c.feeds[o] = values[o]
    c.outputs = [o for o in c.outputs if o.name not in c.feeds]
    if not c.outputs:
        return None
    return c.prune()


def _truncate(g: _Graph, k: int, values: dict) -> _Graph | None:
    """The graph up to node k, its outputs the graph's outputs."""
    c = g.copy()
    outs = [o for o in g.nodes[k].output if o]
    if not outs or [o.name for o in c.outputs] == outs:
        return None
    c.outputs = [_out_info(o, values) for o in outs]
    return c.prune()


def _bypass(g: _Graph, k: int, types: dict, values: dict) -> list:
    """Node k removed, its single output replaced by an input of the same type: one candidate per
    such input."""
    n = g.nodes[k]
    outs = [o for o in n.output if o]
    if len(outs) != 1 or outs[0] not in types:
        return []
    cands = []
    for i in dict.fromkeys(x for x in n.input if x):
        if types.get(i) == types[outs[0]]:
            c = g.copy()
            c.nodes = [_rename_input(m, outs[0], i) for j, m in enumerate(g.nodes) if j != k]
            if any(o.name == outs[0] for o in c.outputs):
                if any(o.name == i for o in c.outputs) or i in c.feeds:
                    continue
                c.outputs = [_out_info(i, values) if o.name == outs[0] else o for o in c.outputs]
            cands.append(c.prune())
    return cands


def _rename_input(n, old: str, new: str):
    if old not in n.input:
        return n
    m = onnx.NodeProto()
    m.CopyFrom(n)
    del m.input[:]
    m.input.extend(new if x == old else x for x in n.input)
    return m


def _static_inputs(g: _Graph) -> _Graph | None:
    """Symbolic input dims made concrete (the feeds' sizes)."""
    c = g.copy()
    changed = False
    ins = []
    for vi in g.inputs:
        x = g.feeds.get(vi.name)
        dims = vi.type.tensor_type.shape.dim if vi.type.HasField("tensor_type") else []
        if isinstance(x, np.ndarray) and x.dtype in _NP and any(not d.HasField("dim_value") for d in dims):
            ins.append(_value_info(vi.name, x))
            changed = True
        else:
            ins.append(vi)
    c.inputs = ins
    return c if changed else None


def shrink(model: onnx.ModelProto, feeds: dict, still_fails: Predicate, *,
           max_tries: int = 400, log=None) -> tuple[onnx.ModelProto, dict]:
    """The smallest model (by nodes) found that still fails; `still_fails` is called at most
    `max_tries` times."""
    log = log or (lambda msg: None)
    values = intermediate_values(model, feeds)
    types = {k: (v.dtype, v.shape) for k, v in values.items() if isinstance(v, np.ndarray)}
    types.update({k: (v.dtype, v.shape) for k, v in feeds.items() if isinstance(v, np.ndarray)})
    for t in model.graph.initializer:
        a = numpy_helper.to_array(t)
        types[t.name] = (a.dtype, a.shape)
    best = _Graph(model, feeds).prune()
    tries = 0

    def attempt(c: _Graph | None) -> bool:
        nonlocal best, tries
        if c is None or tries >= max_tries:
            return False
        if len(c.nodes) > len(best.nodes) or (len(c.nodes) == len(best.nodes) and
                                               len(c.outputs) >= len(best.outputs) and
                                               len(c.inputs) >= len(best.inputs)):
            return False
        tries += 1
        try:
            ok = still_fails(c.build(), c.feeds)
        except Exception:  # noqa: BLE001 - a candidate the harness cannot run is not kept
            ok = False
        if ok:
            best = c
            log(f"shrunk to {len(c.nodes)} nodes")
        return ok

    progress = True
    while progress and tries < max_tries:
        progress = False
        # ddmin over chunks of nodes: cut them (their outputs become inputs)
        chunk = max(1, len(best.nodes) // 2)
        while chunk >= 1 and tries < max_tries:
            k = 0
            while k < len(best.nodes) and tries < max_tries:
                if attempt(_cut(best, set(range(k, min(k + chunk, len(best.nodes)))), values)):
                    progress = True
                else:
                    k += chunk
            chunk //= 2
        # fewer outputs, then everything after a node
        for o in list(best.outputs):
            if len(best.outputs) > 1:
                c = best.copy()
                c.outputs = [x for x in c.outputs if x.name != o.name]
                progress |= attempt(c.prune())
        for k in range(len(best.nodes) - 1, -1, -1):
            if k < len(best.nodes):
                progress |= attempt(_truncate(best, k, values))
        for k in range(len(best.nodes) - 1, -1, -1):
            if k < len(best.nodes):
                for c in _bypass(best, k, types, values):
                    if attempt(c):
                        progress = True
                        break
    c = _static_inputs(best)
    if c is not None and tries < max_tries:
        tries += 1
        if still_fails(c.build(), c.feeds):
            best = c
    return best.build(), best.feeds


# ---------------------------------------------------------------- regression files


def bug_class(model: onnx.ModelProto, signature: str) -> str:
    """A shrunk failure's class: its signature and the op types left in the minimal graph
    (mismatches share one signature; what is left after shrinking tells them apart)."""
    return signature + "|" + ",".join(sorted({n.op_type for n in model.graph.node}))


def save_regression(model: onnx.ModelProto, feeds: dict, folder: str, *, signature: str,
                    message: str, seed=None, levels=(), xfail: str = "", xfail_strict: bool = True,
                    key: str | None = None) -> str:
    """Write `<name>.onnx` (the finding in its metadata) and `<name>.npz` (its inputs);
    returns the .onnx path. The name is the hash of `key` (default: the bug class)."""
    os.makedirs(folder, exist_ok=True)
    h = hashlib.sha1((key or bug_class(model, signature)).encode()).hexdigest()[:10]
    kind = signature.split("|", 1)[0]
    name = f"{kind}_{h}"
    m = onnx.ModelProto()
    m.CopyFrom(model)
    meta = {"kiln.fuzz.signature": signature, "kiln.fuzz.finding": message[:2000],
            "kiln.fuzz.seed": "" if seed is None else str(seed),
            "kiln.fuzz.levels": ",".join(str(x) for x in levels), "kiln.fuzz.xfail": xfail,
            "kiln.fuzz.xfail_strict": "1" if xfail_strict else "0"}
    del m.metadata_props[:]
    for k, v in meta.items():
        m.metadata_props.append(onnx.StringStringEntryProto(key=k, value=v))
    path = os.path.join(folder, name + ".onnx")
    onnx.save(m, path)
    np.savez(os.path.join(folder, name + ".npz"), **feeds)
    return path


def load_regression(path: str) -> tuple[onnx.ModelProto, dict, dict]:
    """(model, feeds, metadata) of a saved regression."""
    m = onnx.load(path)
    meta = {p.key: p.value for p in m.metadata_props}
    npz = os.path.splitext(path)[0] + ".npz"
    feeds = {}
    if os.path.exists(npz):
        with np.load(npz) as z:
            feeds = {k: z[k] for k in z.files}
    return m, feeds, meta


def shrink_finding(model: onnx.ModelProto, feeds: dict, finding, pool, *, use_ort: bool = False,
                   max_tries: int = 400, log=None) -> tuple[onnx.ModelProto, dict]:
    """Shrink a fuzzer finding, each candidate checked in `pool` (a differential.WorkerPool)
    at the finding's level only, keeping the finding's signature."""
    from kiln.testing.differential import job_for_model  # noqa: PLC0415
    levels = (finding.level,) if finding.level is not None else (0,)
    targets = ("cpu",) if finding.target == "cpu" else ("interpreter", "cpu")
    ort = use_ort or finding.kind == "ort-mismatch"

    def still_fails(m, f) -> bool:
        found = pool.run([(0, job_for_model(m, f, levels, ort, targets))])[0]
        return any(x.signature == finding.signature for x in found)
    return shrink(model, feeds, still_fails, max_tries=max_tries, log=log)
