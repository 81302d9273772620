"""Constant data computed when it is first read, or streamed where it is going.

A weight transform made at compile time can be several times the size of the weights
it comes from (Winograd's U: 36/9 of them; ResNet-18's 176 MB). Made as one array on
the compile's path, it costs its arithmetic plus a first touch of every page of a new
allocation (0.25-0.4 s for ResNet-18 on a VM), and is then copied once more into the
weights blob. A `Deferred` holds how to make it instead: `parts()` yields it in
contiguous pieces that a consumer writes where they belong (the module cache's weights
file, in a thread beside the C compiler: kiln.targets.cache.WeightsFile), and `value()`
makes the whole array, once, for anything else that reads the constant (a
kiln.graph.ir.Value's `const`). Both come from the same pieces, so they are equal bit
for bit.
"""

from __future__ import annotations

import threading
from typing import Callable, Iterator

import numpy as np


class Deferred:
    """An array of `shape` and `dtype` made from `parts()`: an iterator of (element offset into
    the flattened array, contiguous 1-D array) covering every element once, in any order; a
    part may be a view of a buffer the next one reuses: use it before asking for the next."""

    def __init__(self, shape: tuple, dtype, parts: Callable[[], Iterator[tuple[int, np.ndarray]]]):
        self.shape, self.dtype, self._parts = tuple(int(d) for d in shape), np.dtype(dtype), parts
        self.size = int(np.prod(self.shape, dtype=np.int64))
        self.nbytes = self.size * self.dtype.itemsize
        self._value: np.ndarray | None = None
        self._lock = threading.Lock()

    @property
    def made(self) -> np.ndarray | None:
        """The whole array if it has been made (or settled), else None."""
        return self._value

    def parts(self) -> Iterator[tuple[int, np.ndarray]]:
        """The data piece by piece (from the whole array where it is already made)."""
        if self._value is not None:
            yield 0, self._value.reshape(-1)
            return
        for offset, piece in self._parts():
            if (piece.dtype != self.dtype or piece.ndim != 1 or not piece.flags.c_contiguous or offset < 0
                    or offset + piece.size > self.size):
                raise ValueError(f"deferred {self.dtype}{list(self.shape)}: part of {piece.size} {piece.dtype} "
                                 f"at {offset} does not fit")
            yield offset, piece

    def value(self) -> np.ndarray:
        """The whole array (made on the first call, from `parts()`)."""
        with self._lock:
            if self._value is None:
                out = np.empty(self.size, self.dtype)
                for offset, piece in self.parts():
                    out[offset:offset + piece.size] = piece
                self._value = out.reshape(self.shape)
            return self._value

    def settle(self, array: np.ndarray) -> None:
        """Use `array` (the same data, already written elsewhere: a view of the weights blob)
        as the whole array from now on, unless it has been made."""
        if array.shape != self.shape or array.dtype != self.dtype:
            raise ValueError(f"deferred {self.dtype}{list(self.shape)} settled with {array.dtype}{list(array.shape)}")
        with self._lock:
            if self._value is None:
                self._value = array

    def __reduce__(self):   # pickled (a graph sent to a worker) as the array it stands for
        return np.asarray, (self.value(),)

    def __repr__(self) -> str:
        return f"Deferred({self.dtype}{list(self.shape)}{', made' if self._value is not None else ''})"


def byte_parts(data: np.ndarray | Deferred) -> Iterator[tuple[int, np.ndarray]]:
    """A weights piece (a contiguous uint8 array, or a Deferred) as (byte offset, uint8 array)
    parts: to be written where the piece goes, each before the next is asked for."""
    if not isinstance(data, Deferred):
        yield 0, data
        return
    for offset, part in data.parts():
        yield offset * data.dtype.itemsize, part.view(np.uint8)


def settle_in(data: np.ndarray | Deferred, blob: np.ndarray, offset: int) -> None:
    """A Deferred piece written into `blob` at byte `offset`: read from there from now on
    (made again, it would cost what writing it saved)."""
    if isinstance(data, Deferred):
        data.settle(blob[offset:offset + data.nbytes].view(data.dtype).reshape(data.shape))
