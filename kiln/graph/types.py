"""Types of graph values: tensors (shape of ints and named symbols), sequences, optionals.

A dim is an `int` or a `str` naming a symbol (`"batch"`). Symbols with the same
name are the same size. Data-dependent sizes get fresh symbols named `_u0`,
`_u1`... A tensor type with `shape=None` has unknown rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from kiln.dtypes import DType

Dim = Union[int, str]


@dataclass(frozen=True)
class TensorType:
    dtype: DType
    shape: tuple[Dim, ...] | None

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    @property
    def is_static(self) -> bool:
        return self.shape is not None and all(isinstance(d, int) for d in self.shape)

    def __str__(self) -> str:
        if self.shape is None:
            return f"{self.dtype}[*]"
        return f"{self.dtype}[{','.join(str(d) for d in self.shape)}]"


@dataclass(frozen=True)
class SequenceType:
    elem: "Type"

    def __str__(self) -> str:
        return f"seq<{self.elem}>"


@dataclass(frozen=True)
class OptionalType:
    elem: "Type"

    def __str__(self) -> str:
        return f"opt<{self.elem}>"


Type = Union[TensorType, SequenceType, OptionalType]


def tensor(dtype: DType | str, shape) -> TensorType:
    """Convenience constructor: `tensor("float32", (1, "n"))`."""
    if isinstance(dtype, str):
        dtype = DType.from_name(dtype)
    return TensorType(dtype, None if shape is None else tuple(shape))


def dims_compatible(a: Dim, b: Dim) -> bool:
    """Two dims may describe the same size (a symbol matches anything)."""
    return isinstance(a, str) or isinstance(b, str) or a == b


def types_compatible(a: Type, b: Type) -> bool:
    """Could a value of type `a` be used where `b` is declared? (unknowns match)"""
    if isinstance(a, TensorType) and isinstance(b, TensorType):
        if a.dtype != b.dtype:
            return False
        if a.shape is None or b.shape is None:
            return True
        return len(a.shape) == len(b.shape) and all(map(dims_compatible, a.shape, b.shape))
    if type(a) is not type(b):
        return False
    return types_compatible(a.elem, b.elem)
