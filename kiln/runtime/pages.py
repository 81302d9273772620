"""Zeroed memory for a module's weights blob in transparent huge pages, where the kernel offers them.

A blob read once an inference (the weights, streamed from L3 as each kernel meets its own) walks
a page table per 4 KB otherwise; numpy asks for huge pages on large arrays too, but its buffer
starts wherever malloc put it, and only the 2 MB ranges inside it get one (MobileNetV2's 14 MB
blob: 12 MB). Aligned to the huge page size, all of it does: MobileNetV2 b1 0.981-0.992 and
MobileNetV3-Large 0.992-0.997 of the time (one thread, thread CPU time, interleaved in one
process). What the kernel offers is read from /sys/kernel/mm/transparent_hugepage: "never" (or
no such file: another OS, or no THP) gives a plain numpy buffer.
"""

from __future__ import annotations

import mmap

import numpy as np

THP = "/sys/kernel/mm/transparent_hugepage"


def huge_page_bytes(root: str = THP) -> int:
    """The size of a transparent huge page (hpage_pmd_size) where the kernel makes them for
    memory that asks (`enabled` is [always] or [madvise]), else 0."""
    try:
        with open(f"{root}/enabled") as f:
            enabled = f.read()
        with open(f"{root}/hpage_pmd_size") as f:
            size = int(f.read().strip())
    except (OSError, ValueError):
        return 0
    if "[never]" in enabled or "[" not in enabled or size <= 0 or size & (size - 1):
        return 0
    return size


def zeroed(nbytes: int, root: str = THP) -> np.ndarray:
    """`nbytes` zero bytes (uint8), starting on a huge page and advised into huge pages
    (MADV_HUGEPAGE) where the kernel offers them (`huge_page_bytes`) and the blob spans one;
    else numpy's zeros."""
    page = huge_page_bytes(root)
    if not page or nbytes < page or not hasattr(mmap, "MADV_HUGEPAGE"):
        return np.zeros(nbytes, dtype=np.uint8)
    # private: mmap's default, a shared anonymous mapping, is shmem, which takes huge pages only
    # as /sys/kernel/mm/transparent_hugepage/shmem_enabled says ("never" by default: ResNet-50's
    # 115 MB blob got none of its 57 huge pages that way)
    region = mmap.mmap(-1, nbytes + page, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)   # zeros, made as touched
    region.madvise(mmap.MADV_HUGEPAGE)
    whole = np.frombuffer(region, dtype=np.uint8)   # (holds the mapping for as long as a view lives)
    start = (-whole.ctypes.data) % page
    return whole[start:start + nbytes]
