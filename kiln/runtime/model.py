"""`CompiledModel`: the object every target returns.

It validates inputs by name, dtype and shape (binding symbolic dims
consistently) before anything runs, so a mismatch is a KilnError naming the
input, the expected and the given — never a crash inside a kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from kiln.dtypes import DType
from kiln.errors import KilnError
from kiln.limits import use as use_limits


@dataclass(frozen=True)
class TensorSpec:
    """Name, dtype name and shape (ints and symbol names) of a model input or output.

    `kind` is "tensor", or the containers around the tensors, outermost first:
    "sequence", "optional", "optional<sequence>" (dtype/shape are the elements').
    """
    name: str
    dtype: str
    shape: tuple | None
    kind: str = "tensor"

    def __str__(self) -> str:
        shape = "*" if self.shape is None else ",".join(map(str, self.shape))
        s = f"{self.name}: {self.dtype}[{shape}]"
        if self.kind == "tensor":
            return s
        depth = self.kind.count("<") + 1
        return f"{self.name}: {self.kind}<{s.split(': ', 1)[1]}" + ">" * depth


class CompiledModel:
    """A runnable model. Subclasses implement `_run(list_of_inputs) -> list_of_outputs`."""

    def __init__(self, inputs: list[TensorSpec], outputs: list[TensorSpec], target: str):
        self.inputs = inputs
        self.outputs = outputs
        self.target = target
        self.limits = None  # kiln.limits.Limits in force while it runs (None: the defaults)
        self._names = [s.name for s in inputs]
        self._out_names = [s.name for s in outputs]
        # per input, the exact numpy dtype an array must have for the fast check (None: the
        # full check always runs: containers, strings, unknown dtype or shape)
        self._fast_dtypes = [_fast_dtype(s) for s in inputs]
        self._valid_shapes: set = set()   # shape tuples the full check accepted

    def __repr__(self) -> str:
        ins = ", ".join(map(str, self.inputs))
        outs = ", ".join(map(str, self.outputs))
        return f"<CompiledModel target={self.target} ({ins}) -> ({outs})>"

    def wait_optimized(self, timeout: float | None = None) -> "CompiledModel":
        """Block until every module this model has built runs its final, optimised code (a
        module built at a quick tier first swaps in its -O3 build when that is ready:
        kiln.codegen.tiers); returns the model. Timing tools call it before they measure. A
        KilnError if that build failed (the quick module keeps serving) or is not ready
        within `timeout` seconds."""
        return self

    @property
    def tier(self) -> str:
        """"final" when every module built runs its optimised code, else "quick"."""
        return "final"

    def run(self, feeds: Mapping[str, Any] | None = None, **kw) -> dict[str, Any]:
        """Run on named inputs; returns {output name: array}."""
        with use_limits(self.limits):
            outs = self._run(self.ordered(feeds if feeds is not None and not kw else dict(feeds or {}, **kw)))
        return dict(zip(self._out_names, outs))

    def ordered(self, feeds: Mapping[str, Any]) -> list:
        """The named inputs in the model's order, validated (names, dtypes, shapes)."""
        names = self._names
        if len(feeds) == len(names):
            try:
                values = [feeds[n] for n in names]
            except (KeyError, TypeError):
                pass
            else:
                return self.validate(values)
        unknown = sorted(set(feeds) - set(names))
        if unknown:
            raise KilnError(f"unknown input name(s) {unknown}; the model's inputs are {names}")
        missing = [n for n in names if n not in feeds]
        if missing:
            raise KilnError(f"missing input(s) {missing}; the model's inputs are {names}")
        return self.validate([feeds[n] for n in names])

    def __call__(self, *args, **kw):
        """Positional call: `model(x, y)` returns outputs as a tuple (one output: the array)."""
        if len(args) != len(self.inputs):
            raise KilnError(f"model takes {len(self.inputs)} inputs "
                            f"({[s.name for s in self.inputs]}), given {len(args)}")
        feeds = {s.name: a for s, a in zip(self.inputs, args)}
        outs = list(self.run(feeds, **kw).values())
        return outs[0] if len(outs) == 1 else tuple(outs)

    def validate(self, values: list) -> list:
        """Check dtype and shape of each input against its spec; bind symbols consistently."""
        # Fast check: arrays of exactly the spec's numpy dtype whose shapes (all of them together,
        # so symbol bindings agree) the full check accepted before pass unchanged, as the full
        # check would pass them. Anything else takes the full check, which names what is wrong.
        if len(values) == len(self._fast_dtypes):
            shapes = []
            for x, dt in zip(values, self._fast_dtypes):
                if dt is None or type(x) is not np.ndarray or (x.dtype is not dt and x.dtype != dt):
                    break
                shapes.append(x.shape)
            else:
                key = tuple(shapes)
                if key in self._valid_shapes:
                    return values
                out = self._validate(values)
                if len(self._valid_shapes) < 256:
                    self._valid_shapes.add(key)
                return out
        return self._validate(values)

    def _validate(self, values: list) -> list:
        """The full check (see validate)."""
        bound: dict[str, tuple[int, str]] = {}
        out = []
        for spec, x in zip(self.inputs, values):
            kinds = [] if spec.kind == "tensor" else spec.kind.replace(">", "").split("<")
            out.append(_check_value(spec, x, kinds, bound))
        return out

    def _run(self, inputs: list) -> list:  # pragma: no cover - abstract
        raise NotImplementedError


def _fast_dtype(spec: TensorSpec):
    """The numpy dtype an input must have exactly for validate's fast check (None: never fast)."""
    if spec.kind != "tensor" or spec.shape is None or spec.dtype in ("unknown", "string"):
        return None
    try:
        return np.dtype(DType.from_name(spec.dtype).np)
    except (KilnError, TypeError):
        return None


def _check_value(spec: TensorSpec, x, kinds: list[str], bound: dict):
    """Check a possibly nested sequence/optional value, then its tensors."""
    if not kinds:
        return _check_tensor(spec, x, bound)
    if kinds[0] == "optional":
        return None if x is None else _check_value(spec, x, kinds[1:], bound)
    if not isinstance(x, (list, tuple)):
        raise KilnError(f"input {spec.name!r}: expected a sequence (list of arrays), "
                        f"given {type(x).__name__}")
    return [_check_value(spec, e, kinds[1:], {}) for e in x]


def _check_tensor(spec: TensorSpec, x, bound: dict) -> np.ndarray:
    if not isinstance(x, np.ndarray):
        if spec.dtype == "string":
            x = np.asarray(x, dtype=object)
        elif isinstance(x, (list, tuple, int, float, bool, np.generic)):
            x = np.asarray(x)
        else:
            raise KilnError(f"input {spec.name!r}: expected a numpy array, given {type(x).__name__}")
    want = spec.dtype
    try:
        got = DType.from_numpy(x.dtype).name
    except KilnError:
        got = str(x.dtype)
    if want != "unknown" and got != want:
        raise KilnError(f"input {spec.name!r}: expected dtype {want}, given {got}")
    if spec.dtype == "string" and x.dtype != object:
        x = x.astype(object)
    if spec.dtype == "string":
        bad = next((v for v in x.reshape(-1) if not isinstance(v, (str, bytes))), None) if x.size else None
        if bad is not None:
            raise KilnError(f"input {spec.name!r}: a string tensor must hold str (or bytes) values, "
                            f"given a {type(bad).__name__} ({bad!r:.40})")
    if spec.shape is not None:
        if x.ndim != len(spec.shape):
            raise KilnError(f"input {spec.name!r}: expected shape {_fmt(spec.shape)} "
                            f"(rank {len(spec.shape)}), given {tuple(x.shape)}")
        for k, (d, s) in enumerate(zip(spec.shape, x.shape)):
            if isinstance(d, int):
                if d != s:
                    raise KilnError(f"input {spec.name!r}: expected shape {_fmt(spec.shape)}, "
                                    f"given {tuple(x.shape)} (dim {k} is {s}, expected {d})")
            elif d in bound and bound[d][0] != s:
                raise KilnError(f"input {spec.name!r}: dim {k} is symbol {d!r} = {s}, but input "
                                f"{bound[d][1]!r} bound {d!r} = {bound[d][0]}")
            else:
                bound.setdefault(d, (s, spec.name))
    return x


def _fmt(shape) -> str:
    return "(" + ", ".join(map(str, shape)) + ")"
