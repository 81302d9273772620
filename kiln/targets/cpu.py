"""target="cpu": native code for every node, specialised to concrete shapes.

A `Program` runs one graph. Per new input shapes it specialises the graph and
builds it through its `ShapePipeline` (kiln.compiler: specialize, then
partition → lower → plan memory → emit → generate → build → load): if every
size is then known, the whole graph is one native module and an inference is
one foreign call. If some output size
depends on data (NonZero, Unique, NonMaxSuppression...), the graph runs in
stages: a native module for the nodes before the first such node, that node's
native kernel (which reports its outputs' actual sizes), then the rest as a
new `Program` specialised to those sizes — cached like everything else.

The graph passes that need static shapes (the NCHWc layout, LayerNorm
recognition, some algebra) cannot fire on a graph with symbolic dims, so a
model compiled with some input size unknown keeps its unoptimised source graph
and, per new input shapes, runs its -O level's passes again on the source
specialised to them: a symbolic batch gets the code the same model with the
batch fixed would get.
"""

from __future__ import annotations

import numpy as np

from kiln.errors import KilnError
from kiln.graph.ir import Graph, Node, Value
from kiln.graph.types import TensorType
from kiln.runtime.model import CompiledModel, TensorSpec


class Deferred:
    """A ShapePipeline made when first used: a model loaded whole from the cache runs its
    module without one, and runs the passes only if asked for more (another shape, an export)."""

    def __init__(self, make, target):
        self._make, self.target, self._made = make, target, None

    def __getattr__(self, name: str):
        if self._made is None:
            self._made = self._make()
        return getattr(self._made, name)


class CpuModel(CompiledModel):
    def __init__(self, pipeline, inputs: list[TensorSpec], outputs: list[TensorSpec], built=None):
        """`pipeline` (kiln.compiler.ShapePipeline) specialises and builds per input shapes:
        now, when every input size is static (compile time is compile()'s), else at the
        first run with each new shape key. `built`: the static inputs' native module, loaded
        whole from the cache (kiln.compiler.cached_model): the pipeline is then not run."""
        super().__init__(inputs, outputs, "cpu")
        self.cpu = pipeline.target     # the CPU its code is for (kiln.targets.Target)
        self.program = Program(pipeline)
        static = all(s.kind == "tensor" and s.shape is not None and all(isinstance(d, int) for d in s.shape)
                     for s in inputs)
        if built is not None:
            self.program.adopt([tuple(s.shape) for s in inputs], built)
            return
        from kiln.lower.module import check_lowerable
        check_lowerable(self.graph)
        if static:
            self.program.prepare([tuple(s.shape) for s in inputs])

    @property
    def graph(self) -> Graph:
        """The optimized graph (a model loaded whole from the cache runs its passes now)."""
        return self.program.graph

    def build_info(self) -> dict | None:
        """The manifest of the first whole-graph native module built (None if none yet)."""
        return next((r.info for r in self.program.runners.values() if hasattr(r, "info")), None)

    @property
    def specializations(self) -> int:
        """Native modules built so far (one per shape key, plus stages)."""
        return self.program.count()

    def wait_optimized(self, timeout: float | None = None) -> "CpuModel":
        for m in self.program.modules():
            if hasattr(m, "wait"):   # (a kiln.targets.tiered.TieredModule)
                m.wait(timeout)
        return self

    @property
    def tier(self) -> str:
        return "final" if all(getattr(m, "final", True) for m in self.program.modules()) else "quick"

    def _run(self, inputs: list) -> list:
        return self.program.run(inputs)

    def profile(self, feeds: dict, runs: int = 10, warm: bool = False) -> list[tuple[str, float]]:
        """Time each kernel of the native module these inputs run on, called one by one
        `runs` times: per call, (the nodes it computes, median seconds). `warm`: each call
        `runs` times in a row, its weights and inputs then in cache as far as they fit
        (kiln.runtime.native's NativeModule.profile)."""
        values = [np.asarray(x) if isinstance(x, (np.generic, int, float, bool)) else x
                  for x in self.ordered(feeds)]
        runner = self.program.runner_for(values)
        info = getattr(runner, "info", None)
        if info is None or "call_args" not in info:
            raise KilnError("per-kernel profiling needs a model that runs as one native module; this "
                            "one runs in stages (data-dependent sizes or control flow)", stage="run")
        _, times = runner.profile(values, info["call_args"], runs, warm)
        return [(what, float(np.median(t))) for what, t in zip(runner.call_nodes, times)]


class Program:
    """One graph, specialised and built per input shapes (and shape-giving input values)."""

    def __init__(self, pipeline):
        self.pipeline = pipeline       # kiln.compiler.ShapePipeline: specialize, native
        self.report = None             # the model's CompileReport, when compile() made one
        self.target = pipeline.target  # the CPU every module is built for
        self.value_inputs: dict[tuple, tuple[int, ...]] = {}
        self.runners: dict[tuple, object] = {}
        # input shapes -> runner, for calls of arrays only whose runner depends on shapes alone
        # (no shape-giving input values): one dict lookup per call instead of building keys
        self.by_shapes: dict[tuple, object] = {}

    def count(self) -> int:
        return sum(r.count() if isinstance(r, (Staged, Passthrough)) else 1 for r in self.runners.values())

    def modules(self) -> list:
        """Every native module built so far (stages' and bodies' included)."""
        out = []
        for r in list(self.runners.values()):
            if isinstance(r, Staged):
                out += ([r.prefix] if r.prefix is not None else []) + r.rest.modules()
                out += [m for p, _ in list(r.bodies.values()) for m in p.modules()]
            elif isinstance(r, Passthrough):
                out += [r.module] if r.module is not None else []
            else:
                out.append(r)
        return out

    @property
    def graph(self) -> Graph:
        return self.pipeline.optimized.graph

    def prepare(self, shapes: list[tuple]) -> None:
        """Build ahead of the first run when shapes alone determine everything."""
        key = tuple(shapes)
        spec = self.note(key, self.pipeline.specialize(list(shapes), {}))
        if not spec.breaks:
            self.adopt(shapes, self.pipeline.native(spec.graph, spec.known, whole=True))

    def adopt(self, shapes: list[tuple], module) -> None:
        """`module` runs inputs of `shapes` (their sizes determine everything)."""
        key = tuple(shapes)
        self.value_inputs[key] = ()
        self.runners[(key, ())] = self.by_shapes[key] = module

    def run(self, inputs: list) -> list:
        r = self.by_shapes.get(tuple([x.shape if type(x) is np.ndarray else None for x in inputs]))
        if r is not None:
            return r(inputs)
        inputs = [np.asarray(x) if isinstance(x, (np.generic, int, float, bool)) else x for x in inputs]
        return self.runner_for(inputs)(inputs)

    def runner_for(self, inputs: list):
        from kiln.lower.specialize import dynamic_values, value_inputs
        shapes = tuple(_shape_key(x) for x in inputs)
        vidx = self.value_inputs.get(shapes)
        if vidx is None:
            spec = self.note(shapes, self.pipeline.specialize(list(shapes), {}))
            vidx = value_inputs(inputs) if dynamic_values(spec.graph) else ()
            self.value_inputs[shapes] = vidx
            if not vidx:
                r = self.runners[(shapes, ())] = self.build_runner(spec)
                if all(type(x) is np.ndarray for x in inputs):
                    self.by_shapes[shapes] = r
                return r
        key = (shapes, tuple((inputs[i].dtype.str, inputs[i].tobytes()) for i in vidx))
        r = self.runners.get(key)
        if r is None:
            spec = self.pipeline.specialize(list(shapes), {i: inputs[i] for i in vidx})
            r = self.runners[key] = self.build_runner(spec)
        return r

    def note(self, shapes, spec):
        """`spec`, its passes' findings (run again at these input sizes: the attention
        fusion's decisions) added to `model.report` when there is one."""
        if self.report is not None and spec.stats:
            self.report.add_shapes(shapes, spec.stats)
        return spec

    def build_runner(self, spec):
        """A static module, or stages when some node breaks the graph."""
        if spec.breaks:
            return Staged(spec, self.pipeline)
        graph = spec.graph
        passthrough = [v for v in graph.outputs if not (isinstance(v.type, TensorType) and v.type.is_static)]
        if not passthrough:
            return self.pipeline.native(graph, spec.known)
        return Passthrough(graph, spec.known, self.pipeline)


def _shape_key(x) -> tuple:
    """What a specialisation depends on: an array's shape; a sequence's element shapes."""
    if isinstance(x, np.ndarray):
        return tuple(x.shape)
    if isinstance(x, list):
        return ("seq",) + tuple(_shape_key(e) for e in x)
    return ("none",) if x is None else ("?",)


class Passthrough:
    """A graph whose non-tensor outputs are its own inputs (sequences handed on unchanged)."""

    def __init__(self, g: Graph, known, pipeline):
        self.inputs = g.inputs
        self.outputs = g.outputs
        self.tensor_outs = [v for v in g.outputs if isinstance(v.type, TensorType) and v.type.is_static]
        ins = [v for v in g.inputs if isinstance(v.type, TensorType)]
        self.tensor_ins = ins
        self.module = pipeline.native(Graph("tensors", ins, self.tensor_outs, g.nodes, g.opsets), known) \
            if self.tensor_outs else None

    def count(self) -> int:
        return 1 if self.module else 0

    def __call__(self, inputs: list) -> list:
        env = {v.id: x for v, x in zip(self.inputs, inputs)}
        if self.module is not None:
            outs = self.module([env[v.id] for v in self.tensor_ins])
            env.update((v.id, x) for v, x in zip(self.tensor_outs, outs))
        return [v.const if v.const is not None else env[v.id] for v in self.outputs]


def _reads(nodes: list[Node]) -> list[Value]:
    """Non-constant values `nodes` read from outside themselves (their subgraphs'
    captures included), in first-use order."""
    out = []
    for n in nodes:
        out += [v for v in n.inputs if v is not None and v.const is None]
        for sg in n.subgraphs():
            out += _captures(sg)
    return _unique(out)


def _captures(body: Graph) -> list[Value]:
    """Values a body graph reads from enclosing graphs."""
    defined = {v.id for v in body.inputs} | {v.id for n in body.nodes for v in n.outputs if v is not None}
    reads = _reads(body.nodes) + [v for v in body.outputs if v.const is None]
    return [v for v in _unique(reads) if v.id not in defined]


class Staged:
    """A graph run in stages: a native module for the nodes before the first "break",
    the break node itself, then a `Program` for the rest (specialised to what the
    break produced). A break is either a node whose output sizes depend on data (its
    native kernel reports them), or a runtime op: control flow (If/Loop/Scan/
    SequenceMap, whose bodies run as native Programs) or a sequence/optional
    container op (which only moves references to arrays)."""

    def __init__(self, spec, pipeline):
        g, known = spec.graph, spec.known
        brk = spec.breaks[0]
        k = brk.index
        self.pipeline = pipeline = pipeline.part(g)
        self.node = node = g.nodes[k]
        self.opset = g.opset(node.domain)
        prefix, suffix = g.nodes[:k], g.nodes[k + 1:]
        made_before = {v.id for n in prefix for v in n.outputs if v is not None}
        later = _reads([node] + suffix) + [v for v in g.outputs if v.const is None]
        self.carry = _unique([v for v in later if v.id in made_before])
        self.inputs = g.inputs
        self.prefix_inputs = [v for v in g.inputs if any(v is x for x in _reads(prefix))]
        self.prefix = pipeline.native(Graph("prefix", self.prefix_inputs, self.carry, prefix, g.opsets),
                                      known) if self.carry else None
        self.runtime = brk.runtime
        self.bodies: dict[int, tuple[Program, list[Value]]] = {}
        if not self.runtime:
            self._build_sizing_kernel(g, known)
        made_after = {x.id for n in suffix for x in n.outputs if x is not None}
        self.rest_inputs = [v for v in _unique(_reads(suffix) + [v for v in g.outputs if v.const is None])
                            if v.id not in made_after]
        self.rest = Program(pipeline.part(Graph("rest", self.rest_inputs, list(g.outputs), suffix, g.opsets)))

    def _build_sizing_kernel(self, g: Graph, known) -> None:
        from kiln.codegen import build_c
        from kiln.lower.kernel import lower_node
        node = self.node
        values = [None if v is None else (v.const if v.const is not None else known.get(v.id))
                  for v in node.inputs]
        func = lower_node(node, self.opset, values, f"dyn_{node.op}", self.pipeline.target)
        if not getattr(func, "dynamic", False):
            raise KilnError("output sizes depend on data, but the lowering made a static kernel",
                            node=node.name, op=node.op, stage="lower")
        self.kernel = build_c(func, self.pipeline.target)[func.name]
        self.func = func

    def count(self) -> int:
        return (1 if self.prefix else 0) + (0 if self.runtime else 1) + self.rest.count() + \
            sum(p.count() for p, _ in self.bodies.values())

    def __call__(self, inputs: list) -> list:
        env = {v.id: x for v, x in zip(self.inputs, inputs)}
        if self.prefix is not None:
            ins = [env[v.id] for v in self.prefix_inputs]
            env.update((v.id, x) for v, x in zip(self.carry, self.prefix(ins)))
        args = [None if v is None else (v.const if v.const is not None else env[v.id])
                for v in self.node.inputs]
        outs = self._run_runtime_op(args, env) if self.runtime else self._run_sizing_kernel(args)
        for v, x in zip(self.node.outputs, outs):
            if v is not None:
                env[v.id] = x
        return self.rest.run([env[v.id] for v in self.rest_inputs])

    def _run_sizing_kernel(self, args: list) -> list:
        from kiln.limits import check_memory
        from kiln.runtime import strings
        from kiln.runtime.native import _native_arrays
        args, keep = _native_arrays([a for a in args if a is not None])
        params = self.func.params[len(args):]
        check_memory(sum(int(np.prod(p.shape, dtype=object)) * p.dtype.itemsize for p in params),
                     "the outputs' largest possible size", node=self.node.name, op=self.node.op, stage="run")
        # string outputs: kiln_str capacity buffers (calloc'd, so untouched capacity is free)
        outs = [np.zeros(p.shape, strings.KILN_STR) if p.dtype.name == "string" else np.empty(p.shape, p.dtype.np)
                for p in params]
        try:
            self.kernel(*args, *outs)
            dims, pos, sized = outs[-1], 0, []
            for buf in outs[:-1]:
                shape = tuple(int(d) for d in dims[pos:pos + buf.ndim])
                pos += buf.ndim
                got = buf.reshape(-1)[:int(np.prod(shape))].reshape(shape)
                sized.append(strings.from_native(got, self.kernel.gather) if buf.dtype == strings.KILN_STR else got.copy())
        finally:
            if self.kernel.release is not None:
                self.kernel.release()
        del keep
        return sized

    def _run_runtime_op(self, args: list, env: dict) -> list:
        """The op's own definition orchestrates; every body it runs is a native Program."""
        from kiln.ops.registry import RunCtx, lookup
        from kiln.graph.types import OptionalType, SequenceType
        node = self.node

        def run_body(body: Graph, xs: list) -> list:
            if id(body) not in self.bodies:
                caps = _captures(body)
                wrapped = Graph(body.name, list(body.inputs) + caps, list(body.outputs), body.nodes,
                                {**body.opsets, **{"": self.opset}} if not body.opsets else body.opsets)
                self.bodies[id(body)] = (Program(self.pipeline.part(wrapped)), caps)
            prog, caps = self.bodies[id(body)]
            return prog.run(list(xs) + [env[v.id] for v in caps])

        try:
            res = lookup(node.domain, node.op).run(RunCtx(node, self.opset, run_body), *args)
        except KilnError:
            raise
        except MemoryError:
            raise
        except Exception as e:  # as the interpreter does: a clear error naming the node
            raise KilnError(f"runtime op failed: {type(e).__name__}: {e}", node=node.name, op=node.op,
                            stage="run") from e
        single = len(node.outputs) == 1 and isinstance(node.outputs[0].type, (SequenceType, OptionalType))
        return list(res) if isinstance(res, (tuple, list)) and not single else [res]


def _unique(vals: list[Value]) -> list[Value]:
    seen, out = set(), []
    for v in vals:
        if v.id not in seen:
            seen.add(v.id)
            out.append(v)
    return out
