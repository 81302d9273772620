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
import contextvars
import fcntl
import hashlib
import os
import stat
import tempfile
import threading
import time
from pathlib import Path

from kiln.errors import KilnError


# the cache root a background build (kiln.targets.tiered) keeps writing to, whatever
# $KILN_CACHE_DIR says by the time it finishes
_PINNED: contextvars.ContextVar[Path | None] = contextvars.ContextVar("kiln_cache_dir", default=None)


def cache_dir() -> Path:
    """The cache root: $KILN_CACHE_DIR, else ~/.cache/kiln (not created or checked here);
    in a `pinned` block, the root pinned."""
    pinned = _PINNED.get()
    if pinned is not None:
        return pinned
    d = os.environ.get("KILN_CACHE_DIR")
    return Path(d) if d else Path.home() / ".cache" / "kiln"


def pinned(root: Path):
    """Set `cache_dir()` to `root` in the current context (for a thread run in it)."""
    _PINNED.set(root)


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


# a file changed less than this long before it was read is not trusted by its identity
# (`file_identity`): a second write within one tick of the file system's clock could leave
# size and times as they were (git's racy-clean problem), one made later shows in them
RACY_NS = 1_000_000_000


def file_identity(path, resolve: bool = True) -> list | None:
    """What says a model file is the one seen before without reading it, as CPython's .pyc
    and ccache's direct mode do: [real path, device, inode, size, mtime_ns, ctime_ns] (an
    edit changes the times, a replacing rename the inode); None if it is no regular file.
    `resolve=False`: `path` as given (already real), its links not resolved."""
    try:
        real = os.path.realpath(path) if resolve else os.fspath(path)
        st = os.stat(real)
    except (OSError, TypeError, ValueError):
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return [real, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def unchanged_since(identity: list, read_at: int) -> bool:
    """Whether the file `identity` (`file_identity`) names is still so, and was last changed
    RACY_NS or more before `read_at` (time.time_ns(), taken before the identity): what was
    read after `read_at` is then what the identity stands for."""
    return file_identity(identity[0], resolve=False) == identity and max(identity[4], identity[5]) <= read_at - RACY_NS


def stamped(name: str, paths: list, compute) -> str:
    """`compute()`: a text that is a function of the files `paths` (real paths) alone, kept in the cache
    dir under `name` and the files' identities and read back while none of them changed
    (a hash of kiln's source, a compiler's version banner: each costs a new process
    milliseconds). Kept beside its sha256, so a damaged copy is computed again."""
    read_at = time.time_ns()
    ids = [file_identity(p, resolve=False) for p in paths]
    try:
        if None in ids:
            raise KilnError("a file is missing")
        key = hashlib.sha256(repr((name, ids)).encode()).hexdigest()
        path = private_dir("stamps") / f"{name}-{key}"
    except KilnError:
        return compute()   # (no cache dir, or no such file: compute it every time)
    try:
        value, _, check = path.read_bytes().decode().rpartition("\n")
        if hashlib.sha256(value.encode()).hexdigest() == check:
            return value
    except (OSError, UnicodeDecodeError):
        pass
    value = compute()
    if all(unchanged_since(i, read_at) for i in ids):
        write_atomic(path, f"{value}\n{hashlib.sha256(value.encode()).hexdigest()}".encode())
    return value


CODE_SUFFIXES = (".py", ".c", ".h")


def source_digest(root: str | os.PathLike, skip: frozenset = frozenset(), name: str = "source") -> str:
    """sha256 (hex) of the code files (.py, .c, .h) under `root`, by relative path and content,
    less the top-level entries named in `skip` and __pycache__: kiln's source for the compile
    cache key, and the part of it that makes kernels for a tuning record's version. Kept as a
    `stamped` value under `name`, so a new process stats the files instead of reading 2 MB.
    With no code files (an install without sources) the distribution's version stands for them."""
    root = os.path.realpath(root)
    paths = []
    # (os.walk and strings: rglob and Paths took as long as the stats)
    for d, dirs, files in os.walk(root):
        top = d == root
        dirs[:] = sorted(x for x in dirs if x != "__pycache__" and not (top and x in skip))
        paths.extend(os.path.join(d, f) for f in sorted(files)
                     if f.endswith(CODE_SUFFIXES) and not (top and f in skip))

    def compute() -> str:
        h = hashlib.sha256()
        for p in paths:
            rel = os.path.relpath(p, root).encode()
            with open(p, "rb") as f:
                data = f.read()
            h.update(b"%d:%s%d:" % (len(rel), rel, len(data)) + data)
        if not paths:
            from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415
            try:
                h.update(version("kiln").encode())
            except PackageNotFoundError:
                h.update(b"unknown")
        return h.hexdigest()
    return stamped(f"{name}-{hashlib.sha256(repr(sorted(skip)).encode()).hexdigest()[:12]}", paths, compute)


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
