"""Showing names from untrusted models: control characters escaped, never raw.

A node or graph name is whatever bytes the model's author chose; printed raw, a
terminal escape sequence in one can rewrite the user's screen. `printable` quotes
a name for a message (like repr); `escape` keeps text as it is but writes every
non-printable character (control, format such as bidi overrides, separators) as
a Python escape.
"""

from __future__ import annotations


def escape(text, keep: str = "") -> str:
    """`text` with each non-printable character not in `keep` written as \\xNN, \\uNNNN or \\UNNNNNNNN."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in keep else _escape_char(c) for c in text)


def printable(name) -> str:
    """A name quoted for a message: repr() of the string (which escapes the same characters)."""
    return repr(str(name))


def _escape_char(c: str) -> str:
    n = ord(c)
    if n < 0x100:
        return f"\\x{n:02x}"
    return f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"
