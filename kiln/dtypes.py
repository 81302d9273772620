"""Element types shared by every IR level (graph, loops, runtime).

One enum maps kiln's names to NumPy dtypes, ONNX TensorProto codes and C types,
so no other module keeps its own table.
"""

from __future__ import annotations

import enum

import ml_dtypes
import numpy as np

from kiln.errors import KilnError


class DType(enum.Enum):
    # value: (onnx code, numpy dtype, C type or None when C has no native type)
    float32 = (1, np.dtype(np.float32), "float")
    uint8 = (2, np.dtype(np.uint8), "uint8_t")
    int8 = (3, np.dtype(np.int8), "int8_t")
    uint16 = (4, np.dtype(np.uint16), "uint16_t")
    int16 = (5, np.dtype(np.int16), "int16_t")
    int32 = (6, np.dtype(np.int32), "int32_t")
    int64 = (7, np.dtype(np.int64), "int64_t")
    string = (8, np.dtype(object), None)
    bool = (9, np.dtype(np.bool_), "bool")
    float16 = (10, np.dtype(np.float16), "_Float16")
    float64 = (11, np.dtype(np.float64), "double")
    uint32 = (12, np.dtype(np.uint32), "uint32_t")
    uint64 = (13, np.dtype(np.uint64), "uint64_t")
    complex64 = (14, np.dtype(np.complex64), None)
    complex128 = (15, np.dtype(np.complex128), None)
    bfloat16 = (16, np.dtype(ml_dtypes.bfloat16), None)
    float8e4m3fn = (17, np.dtype(ml_dtypes.float8_e4m3fn), None)
    float8e4m3fnuz = (18, np.dtype(ml_dtypes.float8_e4m3fnuz), None)
    float8e5m2 = (19, np.dtype(ml_dtypes.float8_e5m2), None)
    float8e5m2fnuz = (20, np.dtype(ml_dtypes.float8_e5m2fnuz), None)
    uint4 = (21, np.dtype(ml_dtypes.uint4), None)
    int4 = (22, np.dtype(ml_dtypes.int4), None)
    float4e2m1 = (23, np.dtype(ml_dtypes.float4_e2m1fn), None)
    float8e8m0 = (24, np.dtype(ml_dtypes.float8_e8m0fnu), None)
    uint2 = (25, np.dtype(ml_dtypes.uint2), None)
    int2 = (26, np.dtype(ml_dtypes.int2), None)

    @property
    def onnx(self) -> int:
        return self.value[0]

    @property
    def np(self) -> np.dtype:
        return self.value[1]

    @property
    def c(self) -> str | None:
        """The C type that holds (and computes on) this dtype's values; None when C has none."""
        return self.value[2]

    @property
    def c_storage(self) -> str | None:
        """The C type of this dtype's bytes in memory: `.c`, or for the storage-only dtypes
        (bfloat16, float8, float4, int4/int2) the unsigned integer of their NumPy itemsize;
        the C backend converts those to float32/int32 to compute; for string the
        `kiln_str` view {pointer, byte length} (kiln.runtime.strings). None for complex."""
        if self is DType.string:
            return "kiln_str"
        return self.c or _STORAGE.get(self)

    @property
    def is_narrow(self) -> bool:
        """A storage-only dtype: C keeps its bytes but computes on it in float32/int32."""
        return self in _STORAGE

    # (the name read as _name_: Enum's `name` descriptor costs more than the test, and the
    # loop simplifier asks is_float of every node it rewrites)
    @property
    def is_float(self) -> bool:
        return self._name_.startswith(("float", "bfloat"))

    @property
    def is_int(self) -> bool:
        return self._name_.startswith(("int", "uint"))

    @property
    def is_signed(self) -> bool:
        return self._name_.startswith("int") or self.is_float

    @property
    def itemsize(self) -> int:
        """Bytes per element in native buffers (a string is a 16-byte `kiln_str` there)."""
        return 16 if self is DType.string else self.np.itemsize

    def __repr__(self) -> str:
        return self.name

    __str__ = __repr__

    @staticmethod
    def from_onnx(code: int) -> "DType":
        try:
            return _BY_ONNX[code]
        except KeyError:
            raise KilnError(f"unsupported ONNX element type code {code}") from None

    @staticmethod
    def from_numpy(dt) -> "DType":
        dt = np.dtype(dt)
        if dt.kind in "USO":
            return DType.string
        try:
            return _BY_NP[dt]
        except KeyError:
            raise KilnError(f"unsupported NumPy dtype {dt}") from None

    @staticmethod
    def from_name(name: str) -> "DType":
        try:
            return DType[name]
        except KeyError:
            raise KilnError(f"unknown dtype name {name!r}") from None


_BY_ONNX = {d.onnx: d for d in DType}
_STORAGE = {d: ("uint16_t" if d.itemsize == 2 else "uint8_t") for d in DType
            if d.c is None and d.name not in ("string", "complex64", "complex128")}
_BY_NP = {d.np: d for d in DType if d is not DType.string}
