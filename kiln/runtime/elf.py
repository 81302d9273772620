"""Checking a shared library's ELF structure before dlopen maps it.

A hash proves a library is the one recorded, not that it is whole: a library cut
short (a truncated member whose SHA256SUMS line was rewritten to match) is mapped by
the dynamic loader beyond the end of the file, and the first touch of a missing page
kills the process with SIGBUS. So the headers are checked first: an ELF shared object
for this byte order and word size, whose program and section headers and every
segment's file bytes lie inside the file.
"""

from __future__ import annotations

import struct

from kiln.errors import KilnError

_ET_DYN, _SHT_NOBITS = 3, 8


def check_elf(data: bytes, where) -> None:
    """Raise a KilnError unless `data` is a structurally whole ELF shared object."""
    def bad(why: str):
        raise KilnError(f"{where}: not a loadable shared library ({why})")
    size = len(data)
    if size < 64 or data[:4] != b"\x7fELF":
        bad("no ELF header")
    cls, order = data[4], data[5]
    if cls not in (1, 2) or order not in (1, 2):
        bad("unknown ELF class or byte order")
    e = "<" if order == 1 else ">"
    wide = cls == 2
    head = struct.Struct(e + ("HHIQQQIHHHHHH" if wide else "HHIIIIIHHHHHH"))
    (e_type, _machine, _version, _entry, phoff, shoff, _flags, _ehsize, phentsize, phnum,
     shentsize, shnum, _shstrndx) = head.unpack_from(data, 16)
    if e_type != _ET_DYN:
        bad(f"ELF type {e_type}, not a shared object")
    ph = struct.Struct(e + ("IIQQQQQQ" if wide else "IIIIIIII"))
    sh = struct.Struct(e + ("IIQQQQIIQQ" if wide else "IIIIIIIIII"))
    if phnum == 0 or phentsize < ph.size or phoff + phnum * phentsize > size:
        bad("program headers lie outside the file")
    for k in range(phnum):
        fields = ph.unpack_from(data, phoff + k * phentsize)
        offset, filesz = (fields[2], fields[5]) if wide else (fields[1], fields[4])
        if filesz and offset + filesz > size:
            bad(f"segment {k} ends at byte {offset + filesz}, the file has {size}: cut short?")
    if shoff:
        if shentsize < sh.size or shoff + shnum * shentsize > size:
            bad("section headers lie outside the file: cut short?")
        for k in range(shnum):
            fields = sh.unpack_from(data, shoff + k * shentsize)
            kind, offset, length = (fields[1], fields[4], fields[5])
            if kind != _SHT_NOBITS and length and offset + length > size:
                bad(f"section {k} ends at byte {offset + length}, the file has {size}: cut short?")
