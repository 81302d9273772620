"""Inputs made from a model's specs: symbolic dims bound to sizes, seeded random arrays.

Shared by `kiln run --random`, `kiln bench` and AOT export, which all need
concrete shapes where the model declares symbols (`batch`, `seq`).
"""

from __future__ import annotations

import numpy as np

from kiln.dtypes import DType
from kiln.errors import KilnError
from kiln.runtime.model import TensorSpec


def symbols(specs: list[TensorSpec]) -> list[str]:
    """The symbolic dims of `specs`, in order of first appearance."""
    out: list[str] = []
    for s in specs:
        out += [d for d in (s.shape or ()) if not isinstance(d, int) and d not in out]
    return out


def bind_dims(specs: list[TensorSpec], given: dict[str, np.ndarray], dims: dict[str, int]) -> dict[str, int]:
    """Sizes of symbols: from `dims`, else read off the arrays `given` for some inputs."""
    known = symbols(specs)
    unknown = sorted(set(dims) - set(known))
    if unknown:
        raise KilnError(f"unknown dim(s) {unknown}; the model's symbolic dims are {known}")
    bound = {k: int(v) for k, v in dims.items()}
    for s in specs:
        x = given.get(s.name)
        if x is not None and s.shape is not None and np.ndim(x) == len(s.shape):
            for d, n in zip(s.shape, np.shape(x)):
                if not isinstance(d, int):
                    bound.setdefault(d, int(n))
    return bound


def concrete_shape(spec: TensorSpec, dims: dict[str, int]) -> tuple[int, ...]:
    """`spec`'s shape with its symbols replaced; a KilnError says which `--dim` is missing."""
    if spec.kind != "tensor" or spec.shape is None:
        raise KilnError(f"input {spec.name!r} is a {spec.kind} of unknown shape; give it as a file "
                        "(--input name=file.npy)")
    free = [d for d in spec.shape if not isinstance(d, int) and d not in dims]
    if free:
        raise KilnError(f"input {spec.name!r} has symbolic dim(s) {free}: give their size "
                        f"(--dim {free[0]}=N)")
    return tuple(d if isinstance(d, int) else int(dims[d]) for d in spec.shape)


def random_input(spec: TensorSpec, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Seeded values of the spec's dtype: normal floats, small non-negative ints, fair bools."""
    dt = DType.from_name(spec.dtype).np
    if dt.kind == "f":
        return rng.standard_normal(shape).astype(dt)
    if dt.kind in "iu":
        return rng.integers(0, 10, shape).astype(dt)
    if dt.kind == "b":
        return rng.random(shape) < 0.5
    raise KilnError(f"input {spec.name!r}: cannot make random values of dtype {spec.dtype}; "
                    "give it as a file (--input name=file.npy)")


def random_inputs(specs: list[TensorSpec], dims: dict[str, int] | None = None, seed: int = 0,
                  given: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Every input not in `given`, random and seeded, shaped consistently with `given` and `dims`."""
    given = dict(given or {})
    bound = bind_dims(specs, given, dict(dims or {}))
    rng = np.random.default_rng(seed)
    for s in specs:
        if s.name not in given:
            given[s.name] = random_input(s, concrete_shape(s, bound), rng)
    return given
