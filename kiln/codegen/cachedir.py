"""The on-disk compile cache's safety: a private directory, atomic writes, hashed files.

Two builders of one entry (threads of one process meeting a new input shape at once,
or processes sharing the cache) take `building(kind, key)` in turn: the first builds,
the others wait, then find the entry built.

Whatever sits in the cache is loaded into this process as native code, so the
directory must be this user's alone: kiln refuses one owned by another user or
writable by group or others (anyone who can write there can run code as you), and
creates its folders with mode 0700. Every library is recorded with its sha256 when
it is built and checked against it before it is loaded (kiln.runtime.native), so a
truncated, garbage or swapped file is rebuilt rather than mapped.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import stat
import tempfile
import threading
from pathlib import Path

from kiln.errors import KilnError


def cache_dir() -> Path:
    """The cache root: $KILN_CACHE_DIR, else ~/.cache/kiln (not created or checked here)."""
    d = os.environ.get("KILN_CACHE_DIR")
    return Path(d) if d else Path.home() / ".cache" / "kiln"


def private_dir(name: str) -> Path:
    """cache_dir()/name, created with mode 0700 where missing, after checking that both
    belong to this user and that no one else can write them."""
    root = cache_dir()
    for d in (root, root / name):
        try:
            d.mkdir(mode=0o700, parents=d is root, exist_ok=True)
        except OSError as e:
            raise KilnError(f"cannot create kiln's cache directory {d} ({e}); set KILN_CACHE_DIR to a "
                            "directory of yours", stage="cache") from None
        check_private(d)
    return root / name


def check_private(d: Path) -> None:
    """Refuse a directory another user owns or that group/others may write, saying how to fix it."""
    st = os.stat(d)
    if not stat.S_ISDIR(st.st_mode):
        raise KilnError(f"kiln's cache path {d} is not a directory; set KILN_CACHE_DIR to a directory "
                        "of yours", stage="cache")
    uid = os.geteuid()
    why = None
    if st.st_uid != uid:
        why = (f"is owned by user id {st.st_uid}, not by you (user id {uid})",
               f"chown -R {uid} {d}")
    elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = " and ".join(w for bit, w in ((stat.S_IWGRP, "group"), (stat.S_IWOTH, "others"))
                           if st.st_mode & bit)
        why = (f"is writable by {who} (mode {stat.S_IMODE(st.st_mode):o})", f"chmod 700 {d}")
    if why:
        raise KilnError(f"kiln refuses its cache directory {d}: it {why[0]}, so someone else could put "
                        f"code there that kiln would load and run as you. Fix it with `{why[1]}` (if you "
                        "trust what is inside; else delete it), or set KILN_CACHE_DIR to a directory "
                        "only you can write", stage="cache")


def sha256_file(path: str | os.PathLike) -> str | None:
    """sha256 (hex) of a file's bytes, or None if it cannot be read."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except OSError:
        return None
    return h.hexdigest()


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to a temp file beside `path` and rename it into place (readers see
    the old or the new file, never half of one; concurrent writers cannot collide)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


@contextlib.contextmanager
def building(kind: str, key: str):
    """Hold the right to build cache entry `key` of `kind` ("modules", "c"): a lock per key
    within this process, and an exclusive file lock (flock) on cache_dir()/locks/kind-key
    across processes. Whoever waited should look in the cache again before building."""
    name = f"{kind}-{key}"
    with _LOCKS_GUARD:
        lock = _LOCKS.setdefault(name, threading.Lock())
    with lock:
        path = private_dir("locks") / f"{name}.lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:
            raise KilnError(f"cannot open the cache lock {path} ({e})", stage="cache") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)   # releases the flock
