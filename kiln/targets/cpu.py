"""target="cpu": native code for every node, specialised to concrete shapes.

A `Program` runs one graph. Per new input shapes it specialises the graph
(kiln.lower.specialize): if every size is then known, the whole graph is one
native module and an inference is one foreign call. If some output size
depends on data (NonZero, Unique, NonMaxSuppression...), the graph runs in
stages: a native module for the nodes before the first such node, that node's
native kernel (which reports its outputs' actual sizes), then the rest as a
new `Program` specialised to those sizes — cached like everything else.
"""

from __future__ import annotations

import numpy as np

from kiln.errors import KilnError
from kiln.graph.ir import Graph, Node, Value
from kiln.runtime.model import CompiledModel, TensorSpec


class CpuModel(CompiledModel):
    def __init__(self, graph: Graph, inputs: list[TensorSpec], outputs: list[TensorSpec]):
        from kiln.lower.module import check_lowerable
        super().__init__(inputs, outputs, "cpu")
        check_lowerable(graph)
        self.graph = graph
        self.program = Program(graph)
        if all(s.kind == "tensor" and s.shape is not None and all(isinstance(d, int) for d in s.shape)
               for s in inputs):
            self.program.prepare([tuple(s.shape) for s in inputs])  # build now: compile time is compile()'s

    @property
    def specializations(self) -> int:
        """Native modules built so far (one per shape key, plus stages)."""
        return self.program.count()

    def _run(self, inputs: list) -> list:
        return self.program.run(inputs)


class Program:
    """One graph, specialised and built per input shapes (and shape-giving input values)."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.value_inputs: dict[tuple, tuple[int, ...]] = {}
        self.runners: dict[tuple, object] = {}

    def count(self) -> int:
        return sum(r.count() if isinstance(r, Staged) else 1 for r in self.runners.values())

    def prepare(self, shapes: list[tuple]) -> None:
        """Build ahead of the first run when shapes alone determine everything."""
        from kiln.lower.specialize import dynamic_values, specialize
        key = tuple(shapes)
        g, known = specialize(self.graph, list(shapes), {})
        if not dynamic_values(g):
            self.value_inputs[key] = ()
            self.runners[(key, ())] = build_static(g, known)

    def run(self, inputs: list) -> list:
        return self.runner_for(inputs)(inputs)

    def runner_for(self, inputs: list):
        from kiln.lower.specialize import dynamic_values, specialize, value_inputs
        shapes = tuple(tuple(x.shape) for x in inputs)
        vidx = self.value_inputs.get(shapes)
        if vidx is None:
            g, known = specialize(self.graph, list(shapes), {})
            if not dynamic_values(g):
                self.value_inputs[shapes] = ()
                r = self.runners[(shapes, ())] = build_static(g, known)
                return r
            vidx = self.value_inputs[shapes] = value_inputs(inputs)
        key = (shapes, tuple((inputs[i].dtype.str, inputs[i].tobytes()) for i in vidx))
        r = self.runners.get(key)
        if r is None:
            g, known = specialize(self.graph, list(shapes), {i: inputs[i] for i in vidx})
            r = self.runners[key] = build_static(g, known) if not dynamic_values(g) else Staged(g, known)
        return r


def build_static(graph: Graph, known):
    """One native module for a graph whose sizes are all known (cached across processes)."""
    from kiln.runtime.native import NativeModule
    from kiln.targets import cache
    key = cache.graph_key(graph, known)
    manifest = cache.load(key)
    if manifest is None:
        manifest = _lower_and_build(graph, known)
        cache.store(key, manifest)
    consts = graph.constants()
    blob = np.zeros(manifest["weights_bytes"], dtype=np.uint8)
    for index, offset in manifest["weights"]:
        raw = np.ascontiguousarray(consts[index].const).view(np.uint8).reshape(-1)
        blob[offset:offset + raw.size] = raw
    return NativeModule(manifest["library"], manifest["entry"],
                        [(tuple(s), d) for s, d in manifest["outputs"]], blob,
                        manifest["workspace_bytes"], manifest["calls"])


def _lower_and_build(graph: Graph, known) -> dict:
    from kiln.codegen import build_c, func_symbol
    from kiln.lower.module import ENTRY, lower_graph
    lm = lower_graph(graph, known)
    lib = build_c(lm.module)
    index = {v.id: i for i, v in enumerate(graph.constants())}
    return {"library": str(lib.path), "entry": func_symbol(ENTRY),
            "outputs": [[list(v.type.shape), v.type.dtype.name] for v in lm.outputs],
            "weights_bytes": int(lm.weights.size),
            "weights": [[index[vid], off] for vid, off in lm.weight_offsets.items()],
            "workspace_bytes": lm.workspace_bytes, "calls": lm.call_nodes,
            "kernels": len(lm.module.funcs) - 1, "arena": str(lm.arena)}


def _first_dynamic(graph: Graph) -> int:
    from kiln.lower.specialize import dynamic_values
    dyn = {v.id for v in dynamic_values(graph)}
    for k, n in enumerate(graph.nodes):
        if any(v is not None and v.id in dyn for v in n.outputs):
            return k
    raise KilnError("no node with data-dependent output sizes found", stage="specialize")


def _reads(nodes: list[Node]) -> list[Value]:
    """Non-constant values read by `nodes` (subgraph captures included), first-use order."""
    out = []
    for n in nodes:
        for m in [n] + [x for sg in n.subgraphs() for _, x in sg.walk()]:
            out += [v for v in m.inputs if v is not None and v.const is None]
    return _unique(out)


class Staged:
    """prefix module → data-dependent node's kernel → Program for the rest."""

    def __init__(self, g: Graph, known):
        from kiln.codegen import build_c
        from kiln.lower.kernel import lower_node
        k = _first_dynamic(g)
        self.node = node = g.nodes[k]
        prefix, suffix = g.nodes[:k], g.nodes[k + 1:]
        made_before = {v.id for n in prefix for v in n.outputs if v is not None}
        later = _reads([node] + suffix) + [v for v in g.outputs if v.const is None]
        self.carry = _unique([v for v in later if v.id in made_before])
        self.inputs = g.inputs
        self.prefix = build_static(Graph("prefix", list(g.inputs), self.carry, prefix, g.opsets),
                                   known) if self.carry else None
        values = [None if v is None else (v.const if v.const is not None else known.get(v.id))
                  for v in node.inputs]
        func = lower_node(node, g.opset(node.domain), values, f"dyn_{node.op}")
        if not getattr(func, "dynamic", False):
            raise KilnError("output sizes depend on data, but the lowering made a static kernel",
                            node=node.name, op=node.op, stage="lower")
        self.kernel = build_c(func)[func.name]
        self.func = func
        made_after = {x.id for n in suffix for x in n.outputs if x is not None}
        self.rest_inputs = [v for v in _unique(_reads(suffix) + [v for v in g.outputs if v.const is None])
                            if v.id not in made_after]
        self.rest = Program(Graph("rest", self.rest_inputs, list(g.outputs), suffix, g.opsets))

    def count(self) -> int:
        return (1 if self.prefix else 0) + 1 + self.rest.count()

    def __call__(self, inputs: list) -> list:
        env = {v.id: x for v, x in zip(self.inputs, inputs)}
        if self.prefix is not None:
            env.update((v.id, x) for v, x in zip(self.carry, self.prefix(inputs)))
        args = [v.const if v.const is not None else env[v.id] for v in self.node.inputs if v is not None]
        params = self.func.params
        outs = [np.empty(p.shape, p.dtype.np) for p in params[len(args):]]
        self.kernel(*[np.ascontiguousarray(a) for a in args], *outs)
        dims, pos = outs[-1], 0
        for v, buf in zip(self.node.outputs, outs[:-1]):
            rank = buf.ndim
            shape = tuple(int(d) for d in dims[pos:pos + rank])
            pos += rank
            if v is not None:
                env[v.id] = buf.reshape(-1)[:int(np.prod(shape))].reshape(shape).copy()
        return self.rest.run([env[v.id] for v in self.rest_inputs])


def _unique(vals: list[Value]) -> list[Value]:
    seen, out = set(), []
    for v in vals:
        if v.id not in seen:
            seen.add(v.id)
            out.append(v)
    return out
