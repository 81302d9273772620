"""A native module served at its quick tier until its optimised build is ready.

kiln.compiler.native builds a big module twice (kiln.codegen.tiers says when and why): at -Og
now, and at -O3 in a `TieredModule`'s thread, whose compiler processes run at low priority.
The thread holds the module's build lock (kiln.codegen.cachedir.building) and its cache root
until the -O3 module is in the module cache, then swaps it in. A run calls the module that is
current when it starts: it never changes module midway, and runs on the two at once (threads)
are each correct, each module having its own arena. A compile meeting a module whose build is
under way in this process (`pending`) shares it instead of building it again. The thread is
not a daemon: a process that ends before the build does waits for it at exit, so the -O3
module is cached for the next process; a process killed meanwhile leaves no entry (the cache
writes are atomic, the entry written last) and the next compile builds it again.

The -O3 compilers start once the first run has returned (or `wait` is called, or START_AFTER
seconds have passed with no run): a compile is most often followed by a run at once, which
they would otherwise share the cores with, at the quick tier's slow speed.
"""

from __future__ import annotations

import contextvars
import os
import threading

from kiln.errors import KilnError

_PENDING: dict[str, "TieredModule"] = {}   # module cache key -> its build under way here
_LOCK = threading.Lock()
START_AFTER = 1.0   # seconds: the -O3 build starts then if no run has ended sooner


class TieredModule:
    def __init__(self, key: str, quick, finish, held, specs=None):
        """Serve native module `quick` while `finish()` (run in a thread, at low priority, with
        `held`, an ExitStack of the build's lock and files, closed when it returns) builds,
        caches and returns the optimised module. `specs`: the model's input and output specs as
        a whole-model cache entry keeps them (kiln.targets.loaded.cached_whole)."""
        from kiln.codegen.cachedir import cache_dir, pinned  # noqa: PLC0415
        self.current, self.final, self.error, self.specs = quick, False, None, specs
        self.key = key
        self._done = threading.Event()
        self._go = threading.Event()    # set: the -O3 build may start (`_build`)
        from kiln.timing import unrecorded  # noqa: PLC0415
        context = contextvars.copy_context()
        context.run(pinned, cache_dir())
        context.run(unrecorded)
        self._thread = threading.Thread(target=context.run, args=(self._build, finish, held),
                                        name="kiln-cc-final")
        with _LOCK:
            _PENDING[key] = self
        self._thread.start()

    def _build(self, finish, held) -> None:
        from kiln.codegen.tiers import background  # noqa: PLC0415
        try:
            with held, background():
                self._go.wait(START_AFTER)
                module = finish()
            self.current, self.final = module, True   # (one assignment: the next run takes it)
        except BaseException as e:  # noqa: BLE001 - the quick module keeps serving; wait() raises it
            self.error = e
        finally:
            _forget(self)

    def __call__(self, inputs: list) -> list:
        out = self.current(inputs)
        if not self._go.is_set():
            self._go.set()      # (the first run is over: the -O3 build may take the cores)
        return out

    def __getattr__(self, name: str):   # the module's other calls and facts (info, profile, ...)
        if "current" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["current"], name)

    def wait(self, timeout: float | None = None) -> None:
        """Block until the optimised module serves; a KilnError if it failed to build (the
        quick one keeps serving) or is not ready within `timeout` seconds."""
        self._go.set()
        if not self._done.wait(timeout):
            raise KilnError(f"the optimised build is not ready after {timeout} s", stage="codegen")
        if self.error is not None:
            raise KilnError(f"the optimised (-O3) build failed; the quick tier's module serves: "
                            f"{self.error}", stage="codegen") from self.error


def _forget(m: TieredModule) -> None:
    with _LOCK:
        if _PENDING.get(m.key) is m:
            del _PENDING[m.key]
    m._done.set()


def pending(key: str) -> TieredModule | None:
    """The module under `key` whose optimised build runs in this process, if any."""
    with _LOCK:
        return _PENDING.get(key)


def wait_all() -> None:
    """Block until every background build under way in this process has ended."""
    for m in _start_all():
        m._done.wait()


def _after_fork() -> None:
    """A forked child has none of the parent's build threads: its tiered modules keep their
    quick module, and waiting for them says so at once."""
    global _LOCK
    _LOCK = threading.Lock()   # (another thread may have held it at the fork)
    for m in list(_PENDING.values()):
        m.error = KilnError("the process forked while the optimised build ran; it runs in the parent only")
        _forget(m)


os.register_at_fork(after_in_child=_after_fork)


def _start_all() -> list:
    """Let every build under way start (none waits for a run any longer), and return them: at
    exit, before the interpreter joins the build threads, and in wait_all."""
    with _LOCK:
        builds = list(_PENDING.values())
    for m in builds:
        m._go.set()
    return builds


if hasattr(threading, "_register_atexit"):   # (CPython: runs before non-daemon threads are joined)
    threading._register_atexit(_start_all)
