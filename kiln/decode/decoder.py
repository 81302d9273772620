"""`Decoder`: token-by-token decoding with a KV cache written in place, compiled a bounded
number of times.

    dec = kiln.Decoder("decoder.onnx", capacity=2048)   # past key/values in, present out
    cache = dec.new_cache(batch=1)         # zeroed [B, H, capacity, D] buffers, length 0
    out = dec.prefill(cache, input_ids=prompt, position_ids=pos)  # a prompt, in 2^k-token steps
    out = dec.step(cache, input_ids=ids, position_ids=pos)   # one step; the model's other inputs
    out["logits"]                          # the outputs other than the presents
    cache.length                           # int64 [B]: rows filled (grew by seq)
    cache.past("past_key_values.0.key")    # a view of the filled rows, no copy

The model is rewritten once to a fixed-capacity cache (kiln.decode.static_cache), then
compiled as any model: one native module per new-token count `seq` (a prompt, then 1
per generated token), never per past length, so 128 generated tokens after a prompt
build two modules (and none when the disk cache has them); `prefill` runs a prompt in
power-of-two chunks, so prompts of every length share log2(capacity) + 1 modules. A step binds each cache
buffer as both its past input and its present output (NativeModule.run_bound, IO
binding), so the step's only write to the cache is the `seq` new rows of each layer's
keys and values, and attention reads the filled rows in place of a copied past.

A decoder exported by torch.onnx.export (its cache concatenated in the graph, the mask and
positions computed from the past length) is rewritten by kiln.decode.concat_cache instead
and compiled as one shape-generic module: every past length and every token count run on
it (prefill is one step), the cache buffers bound the same way; one-token steps run on a
second one whose batch and token count are fixed (its cache length still generic).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.errors import KilnError
from kiln.decode.concat_cache import ConcatCache, concat_cache, is_concat_form
from kiln.decode.static_cache import NotStaticCache, StaticCache, static_cache


class KVCache:
    """The cache buffers of one generation: per cache tensor a [B, H, capacity, D] array
    (bound as both past input and present output) and the rows filled per batch entry."""

    def __init__(self, static: StaticCache, batch: int, dtypes: dict):
        self.capacity = static.capacity
        self.buffers = {p.past: np.zeros((batch, p.heads, static.capacity, p.dim), dtypes[p.past])
                        for p in static.pairs}
        self.length = np.zeros(batch, np.int64)
        self.rows = np.zeros(static.capacity + 1, np.uint8)   # the Concat form's carrier, never read

    @property
    def batch(self) -> int:
        return len(self.length)

    def past(self, name: str) -> np.ndarray:
        """The filled rows of cache tensor `name` (batch entries of equal length), a view."""
        n = int(self.length[0])
        if np.any(self.length != n):
            raise KilnError(f"cache entries hold {self.length.tolist()} rows; read the buffers directly")
        return self.buffers[name][:, :, :n]

    def reset(self) -> None:
        """Start a new generation in the same buffers (their old rows are never read again)."""
        self.length[:] = 0


class Decoder:
    """A decoder with past key/values compiled for a static KV cache of `capacity` rows (see the
    module docstring); `compile_options` go to kiln.compile (opt_level, cpu, limits, ...)."""

    def __init__(self, model: Any, capacity: int, **compile_options):
        from kiln.compiler import compile as kiln_compile, frontend  # noqa: PLC0415
        if compile_options.get("target") == "interpreter" or compile_options.get("shapes", "specialize") != "specialize":
            raise KilnError("kiln.Decoder builds a native module per new-token count (a cpu target, shapes "
                            f"'specialize'); given {compile_options}")
        graph = frontend(model)
        try:
            self.static: StaticCache | ConcatCache = static_cache(graph, capacity)
        except NotStaticCache:
            if not is_concat_form(graph):
                raise
            self.static = concat_cache(graph, capacity)
        self.concat = isinstance(self.static, ConcatCache)
        self._options = compile_options
        self._one: dict[int, Any] = {}   # the Concat form's one-token modules, per batch size
        if self.concat:   # one module for every past length and token count
            self.model = _generic(self.static.graph, compile_options)
        else:
            self.model = kiln_compile(self.static.graph, **compile_options)
        self.capacity = self.static.capacity
        past = {p.past for p in self.static.pairs}
        self.presents = {p.present: p.past for p in self.static.pairs}
        own = {self.static.length, getattr(self.static, "rows", None)}
        self.feeds = [s.name for s in self.model.inputs if s.name not in past and s.name not in own]
        self._dtypes = {s.name: np.dtype(s.dtype) for s in self.model.inputs if s.name in past}
        self._outs = [s.name for s in self.model.outputs]
        self._rows = _update_rows(self.static, self.model.inputs)

    def new_cache(self, batch: int = 1) -> KVCache:
        return KVCache(self.static, batch, self._dtypes)

    @property
    def modules(self) -> int:
        """Native modules built so far (one per new-token count seen; the Concat form's: the
        generic one, and one per batch size of one-token steps)."""
        return self.model.specializations + len(self._one)

    def _model_for(self, batch: int, seq: int):
        """The compiled model a step of `seq` tokens for `batch` entries runs on: the static
        form's (specialised per token count); the Concat form's generic module, or for one
        token (every decode step) the module with batch and token count fixed and the cache
        length alone generic (a one-row GEMV there, not a GEMM over a symbolic row count:
        a 4-layer 512-wide decoder's step at past 1500 took 3.6 ms generic, 2.7 fixed)."""
        if not self.concat or seq != 1 or isinstance(self._rows, int):
            return self.model
        m = self._one.get(batch)
        if m is None:
            i, axis = self._rows
            fixed = {self.static.graph.inputs[i].type.shape[axis]: 1}
            b = self.static.graph.inputs[[v.name for v in self.static.graph.inputs].index(self.static.length)]
            if isinstance(b.type.shape[0], str):
                fixed[b.type.shape[0]] = batch
            m = self._one[batch] = _generic(_fix_dims(self.static.graph, fixed), self._options)
        return m

    def step(self, cache: KVCache, feeds: dict | None = None, **kw) -> dict[str, np.ndarray]:
        """Run one step on the model's other inputs (`feeds`, by name): the new tokens' keys and
        values are written into `cache` after its filled rows, `cache.length` grows by the step's
        token count, and the outputs other than the presents are returned by name."""
        feeds = dict(feeds or {}, **kw)
        missing = [n for n in self.feeds if n not in feeds]
        unknown = sorted(set(feeds) - set(self.feeds))
        if missing or unknown:
            raise KilnError(f"Decoder.step takes the inputs {self.feeds} (the cache is bound by the decoder); "
                            f"missing {missing}, unknown {unknown}")
        seq = self._seq(feeds)
        if np.any(cache.length + seq > cache.capacity):
            raise KilnError(f"the KV cache is full: {int(cache.length.max())} of {cache.capacity} rows filled, "
                            f"{seq} more asked for; make the Decoder with a larger capacity")
        if self.concat and np.any(cache.length != cache.length[0]):
            raise KilnError(f"cache entries hold {cache.length.tolist()} rows; a decoder that concatenates its "
                            "cache takes batch entries of one length")
        model = self._model_for(cache.batch, seq)
        values = []
        for s in model.inputs:
            if s.name == self.static.length:
                values.append(cache.length)
            elif self.concat and s.name == self.static.rows:
                values.append(cache.rows[:int(cache.length[0]) + 1])
            else:
                values.append(cache.buffers[s.name] if s.name in cache.buffers else feeds[s.name])
        values = [np.ascontiguousarray(x) for x in model.validate(values)]
        runner = model.module if self.concat else self._runner(values)
        types = runner.output_shapes_at(values) if self.concat else runner.output_types
        outs = [cache.buffers[self.presents[n]] if n in self.presents else np.empty(shape, dt)
                for n, (shape, dt) in zip(self._outs, types)]
        from kiln.limits import use as use_limits  # noqa: PLC0415
        with use_limits(model.limits):
            runner.run_bound(values, outs)
        cache.length += seq
        return {n: o for n, o in zip(self._outs, outs) if n not in self.presents}

    def prefill(self, cache: KVCache, feeds: dict | None = None, **kw) -> dict[str, np.ndarray]:
        """`step` over a prompt in power-of-two chunks, largest first (13 tokens: 8, 4, 1): every
        input with the token axis is cut along it, the outputs with it are joined along it (the
        others are the last chunk's). Prompts of any length then run on the modules of those
        chunk sizes: serving every prompt length up to the capacity builds log2(capacity) + 1
        modules at most, where `step` builds one per distinct prompt length."""
        feeds = dict(feeds or {}, **kw)
        if isinstance(self._rows, int) or self.concat:   # (the Concat form's module takes every length)
            return self.step(cache, feeds)
        i, axis = self._rows
        sym = self.model.inputs[i].shape[axis]
        if self.model.inputs[i].name not in feeds:
            return self.step(cache, feeds)   # step names what is missing
        n = np.shape(feeds[self.model.inputs[i].name])[axis]
        cut = {s.name: list(s.shape).index(sym) for s in self.model.inputs if s.shape and sym in s.shape}
        join = {s.name: list(s.shape).index(sym) for s in self.model.outputs if s.shape and sym in s.shape}
        parts, start = [], 0
        for size in _chunks(n):
            part = {k: np.take(np.asarray(v), np.arange(start, start + size), axis=cut[k]) if k in cut else v
                    for k, v in feeds.items()}
            parts.append(self.step(cache, part))
            start += size
        return {k: np.concatenate([p[k] for p in parts], axis=join[k]) if k in join else parts[-1][k]
                for k in parts[0]}

    def _runner(self, values: list):
        program = self.model.program
        r = program.by_shapes.get(tuple(x.shape for x in values))
        if r is None:
            r = program.runner_for(values)
        if not hasattr(r, "run_bound"):
            raise KilnError("this decoder runs in stages (data-dependent sizes or control flow), so its cache "
                            "cannot be bound in place", stage="decode")
        return r

    def _seq(self, feeds: dict) -> int:
        """The step's new-token count: the rows each cache write takes (its update's axis 2),
        an int or the size of an input's axis."""
        if isinstance(self._rows, int):
            return self._rows
        i, axis = self._rows
        name = self.model.inputs[i].name
        return int(np.shape(feeds[name])[axis])


def _generic(graph, options: dict):
    """`graph` compiled as one shape-generic module (refused, saying why, where it cannot be),
    its arena planned per doubling of the symbols rather than per step (round_plans)."""
    from kiln.compiler import compile as kiln_compile  # noqa: PLC0415
    model = kiln_compile(graph, shapes="generic", **options)
    if model.shapes != "generic":
        raise NotStaticCache("the decoder's past/present Concat form became a KV cache, but not one "
                             f"shape-generic module: {model.shapes_reason}", stage="decode")
    model.module.round_plans = True
    return model


def _fix_dims(graph, fixed: dict):
    """A copy of `graph` with the input symbols in `fixed` made those sizes, types inferred anew."""
    from kiln.graph.types import TensorType  # noqa: PLC0415
    from kiln.ops.infer import Inferencer  # noqa: PLC0415
    g = graph.clone()
    for v in g.inputs:
        t = v.type
        if isinstance(t, TensorType) and t.shape is not None:
            v.type = TensorType(t.dtype, tuple(fixed.get(d, d) if isinstance(d, str) else d for d in t.shape))
    Inferencer(g.opsets).infer_graph(g)
    return g


def _chunks(n: int) -> list[int]:
    """n as powers of two, largest first (0: one empty chunk, which `step` refuses or runs)."""
    return [1 << k for k in range(int(n).bit_length() - 1, -1, -1) if n >> k & 1] or [0]


def _update_rows(static: StaticCache | ConcatCache, inputs) -> int | tuple[int, int]:
    """Where a step's new-token count is read: an int, or (input index, axis) of its symbol
    (the Concat form's sizes named by kiln.lower.symbolic_shapes first: its new rows' size is
    computed in the graph)."""
    g = static.graph
    if isinstance(static, ConcatCache):
        from kiln.lower.generic import graph_symbols  # noqa: PLC0415
        from kiln.lower.symbolic_shapes import Undecided, resolve  # noqa: PLC0415
        try:
            g = resolve(g, graph_symbols(g), for_lowering=False).graph
        except Undecided as e:
            raise NotStaticCache(f"the cache's sizes are not polynomials of the input sizes: {e}",
                                 stage="decode") from e
    presents = {p.present for p in static.pairs}
    rows = {n.inputs[1].type.shape[2] for n in g.nodes if n.op == "TensorScatter" and n.outputs[0].name in presents}
    if len(rows) != 1:
        raise KilnError(f"the cache writes have different or unknown token counts {sorted(map(str, rows))}",
                        stage="decode")
    (r,) = rows
    if isinstance(r, int):
        return r
    for i, spec in enumerate(inputs):
        if spec.shape is not None and r in spec.shape:
            return i, list(spec.shape).index(r)
    raise KilnError(f"the step's token count {r!r} is not a dim of any input", stage="decode")
