"""String tensors at the native boundary: NumPy object arrays <-> arrays of `kiln_str`.

Native code holds a string as `typedef struct { const char* ptr; int64_t len; } kiln_str;`
(UTF-8 bytes, not NUL-terminated). An input's strings are encoded into one byte blob
that lives as long as the call; kernels that make new strings (StringConcat, case
changes) take their bytes from a per-thread arena in the module (`kiln_str_alloc`),
which the library's `strings_release` frees once the outputs have been copied back into
Python strings.
Outputs may also point into the inputs (StringSplit's pieces) or into the library's
own constants: every output is decoded before the inputs' blob is dropped.

Lone surrogates round-trip (`surrogateescape`), so any Python `str` or `bytes`
value goes through unchanged.
"""

from __future__ import annotations

import ctypes

import numpy as np

from kiln.errors import KilnError

KILN_STR = np.dtype([("ptr", np.uintp), ("len", np.int64)])  # matches the C struct (16 bytes)


def _utf8(v) -> bytes:
    if isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode("utf-8", "surrogateescape")
    if isinstance(v, np.str_):
        return str(v).encode("utf-8", "surrogateescape")
    raise TypeError(f"a string tensor holds {type(v).__name__}, not str")


def to_native(x: np.ndarray) -> tuple[np.ndarray, object]:
    """(the kiln_str array of `x`'s strings, the blob its pointers point into: keep it alive)."""
    flat = np.asarray(x, dtype=object).reshape(-1).tolist()
    try:  # all str: one join and one encode in C, byte lengths fixed up only for non-ASCII strings
        text = "".join(flat)
        data = text.encode("utf-8", "surrogateescape")
        lens = np.fromiter(map(len, flat), dtype=np.int64, count=len(flat))
        if len(data) != len(text):
            wide = np.flatnonzero(~np.fromiter(map(str.isascii, flat), dtype=bool, count=len(flat)))
            lens[wide] = [len(flat[k].encode("utf-8", "surrogateescape")) for k in wide.tolist()]
    except TypeError:  # bytes (or something else, refused by _utf8) among the elements
        enc = [_utf8(v) for v in flat]
        data = b"".join(enc)
        lens = np.fromiter(map(len, enc), dtype=np.int64, count=len(enc))
    blob = np.frombuffer(data or b"\0", dtype=np.uint8)
    out = np.empty(np.shape(x), dtype=KILN_STR)
    view = out.reshape(-1)
    starts = np.zeros(len(flat), dtype=np.int64)
    if len(flat) > 1:
        np.cumsum(lens[:-1], out=starts[1:])
    view["ptr"] = blob.ctypes.data + starts.astype(np.uintp)
    view["len"] = lens
    return out, blob


def from_native(a: np.ndarray, gather=None) -> np.ndarray:
    """A NumPy object array of `str` from a kiln_str array (the bytes are copied).

    `gather` (the library's strings_gather, see `gather_function`) copies every string's
    bytes into one buffer in one call; they are then decoded at once and sliced by code
    point offsets (a string's code points are its bytes that are not UTF-8 continuation
    bytes). Without it, or for text that is not valid UTF-8, each string is read alone."""
    flat = np.ascontiguousarray(a.reshape(-1))
    n = flat.size
    out = np.empty(n, dtype=object)
    lens = flat["len"].astype(np.int64)
    if n and (lens < 0).any():
        raise KilnError("native code returned a string of negative length", stage="run")
    total = int(lens.sum()) if n else 0
    if gather is not None and n:
        buf = np.empty(max(total, 1), dtype=np.uint8)
        gather(flat.ctypes.data, n, buf.ctypes.data)
        data = buf[:total]
        text = data.tobytes().decode("utf-8", "surrogateescape")
        ends = np.cumsum(lens)
        starts = ends - lens
        if len(text) != total:  # non-ASCII: byte offsets -> code point offsets
            cum = np.zeros(total + 1, dtype=np.int64)
            np.cumsum((data & 0xC0) != 0x80, out=cum[1:])
            if cum[-1] != len(text):
                gather = None  # invalid UTF-8: decode string by string below
            else:
                starts, ends = cum[starts], cum[ends]
        if gather is not None:
            out[:] = [text[s:e] for s, e in zip(starts.tolist(), ends.tolist())]
            return out.reshape(a.shape)
    string_at = ctypes.string_at
    for k, (p, m) in enumerate(zip(flat["ptr"].tolist(), lens.tolist())):
        out[k] = string_at(p, m).decode("utf-8", "surrogateescape") if m else ""
    return out.reshape(a.shape)


def gather_function(lib: ctypes.CDLL, prefix: str = "kiln_"):
    """The library's `<prefix>strings_gather` (None for a library that has none)."""
    return _function(lib, prefix + "strings_gather", [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p])


def release_function(lib: ctypes.CDLL, prefix: str = "kiln_"):
    """The library's `<prefix>strings_release`, which frees the calling thread's string arena."""
    return _function(lib, prefix + "strings_release", [])


def _function(lib: ctypes.CDLL, symbol: str, argtypes: list):
    try:
        fn = getattr(lib, symbol)
    except AttributeError:
        return None
    fn.restype = ctypes.c_int32
    fn.argtypes = argtypes
    return fn
