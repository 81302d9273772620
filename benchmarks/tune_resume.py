"""Does an interrupted and resumed `kiln tune` end where an uninterrupted one does?

    python benchmarks/tune_resume.py MODEL.onnx [--dim batch=8] [--budget 120] [--clock cpu]

Three tuning runs of the same total budget, each into a fresh database, through the CLI:

- A: uninterrupted, seed 0;
- B: uninterrupted, seed 1: how far two uninterrupted runs differ (search and measurement
  noise): the yardstick for "the same result";
- R: seed 0, interrupted with SIGINT (Ctrl-C) half-way, then the same command run again for
  the rest of the budget (it resumes from its records).

Then, in this process on one thread by thread CPU time (so that it means something on a
loaded machine; `--clock wall` tunes on the model's threads but this comparison stays on one),
the model is compiled untuned and with each database and timed interleaved; the table gives each
run's records, its estimated speedup (the database's best kernel times x weights) and the
measured end-to-end speedup. R matches A "within noise" when |R - A| <= |B - A| + the spread of
the untuned model's own repeated medians.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

os.environ["OMP_NUM_THREADS"] = "1"    # read when kiln's first module loads
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("KILN_TIER", "full")   # time the -O3 build, never a quick tier (kiln.codegen.tiers)

import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def kiln_tune(model: str, db: str, budget: float, seed: int, clock: str, dims: list[str],
              interrupt_after: float | None = None) -> tuple[float, str]:
    """Run `kiln tune` (SIGINT after `interrupt_after` s of its tuning); its reported seconds and output."""
    cmd = [sys.executable, "-m", "kiln", "tune", model, "--budget", f"{budget:.0f}s", "--db", db, "--seed", str(seed),
           "--clock", clock, "--no-end-to-end", *[a for d in dims for a in ("--dim", d)]]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]), COLUMNS="160")
    env.pop("OMP_NUM_THREADS", None)    # the tuner's worker chooses (--clock)
    # each run builds into its own C cache (a resumed run: the one its first half filled), so that no
    # run finds candidates another one built
    env["KILN_CACHE_DIR"] = os.path.splitext(db)[0] + "-cache"
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if interrupt_after is not None:
        # the budget starts once the tasks are extracted: wait for the first record, then count
        start = time.perf_counter()
        while p.poll() is None and not _has_records(db) and time.perf_counter() - start < 600:
            time.sleep(0.2)
        time.sleep(interrupt_after)
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
    out, _ = p.communicate()
    m = re.search(r"kiln tune: \d+ tasks?, (\d+) s", out)
    if p.returncode not in (0, 130) or m is None:
        raise SystemExit(f"kiln tune failed ({p.returncode}):\n{out[-3000:]}")
    return float(m.group(1)), out


def _has_records(db: str) -> bool:
    if not os.path.exists(db):
        return False
    import sqlite3  # noqa: PLC0415
    try:
        with sqlite3.connect(db, timeout=1) as c:
            return c.execute("SELECT COUNT(*) FROM records").fetchone()[0] > 0
    except sqlite3.Error:
        return False


def estimated(tasks, db: str, clock: str) -> tuple[float, int, dict]:
    """The database's estimated end-to-end speedup, its record count, and each task's best decisions."""
    from kiln.tune.records import Database  # noqa: PLC0415
    from kiln.tune.signature import signature  # noqa: PLC0415
    sig = signature(clock=clock)
    before = after = 0.0
    best = {}
    with Database(db) as d:
        for t in tasks:
            base = d.default_seconds(t.key, sig)
            top = d.best(t.key, sig)
            if base is None:
                continue
            before += t.weight * base
            after += t.weight * (top.seconds if top is not None else base)
            best[t.key] = None if top is None or top.is_default else top.decisions
        n = d.count(sig)
    return (before / after if after else 1.0), n, best


def end_to_end(model: str, dims: dict, dbs: dict[str, str], budget: float = 8.0) -> dict[str, list[float]]:
    """Median thread CPU ms of the model untuned and with each database, interleaved, in rounds
    (the spread of a name's per-round medians is the noise of this measurement)."""
    import kiln  # noqa: PLC0415
    from kiln.tuning import random_feeds  # noqa: PLC0415
    models = {"untuned": kiln.compile(model, tuning="")}
    models.update({k: kiln.compile(model, tuning=v) for k, v in dbs.items()})
    feeds = random_feeds(models["untuned"], dims)
    want = models["untuned"].run(feeds)
    for k, m in models.items():
        got = m.run(feeds)
        assert all(np.allclose(got[o], want[o], rtol=1e-3, atol=1e-3) for o in want), f"{k}: outputs differ"
    rounds: dict[str, list[float]] = {k: [] for k in models}
    for _ in range(5):
        times: dict[str, list[float]] = {k: [] for k in models}
        end = time.perf_counter() + budget / 5
        while time.perf_counter() < end or len(times["untuned"]) < 5:
            for k, m in models.items():
                t = time.thread_time()
                m.run(feeds)
                times[k].append(time.thread_time() - t)
        for k in models:
            rounds[k].append(float(np.median(times[k])) * 1e3)
    return rounds


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--dim", action="append", default=[], help="NAME=SIZE, as kiln tune --dim")
    ap.add_argument("--budget", type=float, default=120.0, help="seconds of tuning per run, in all")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="cpu")
    ap.add_argument("--work", default=None, help="folder for the databases (default: a temporary one)")
    args = ap.parse_args(argv)
    from kiln.tuning import extract_tasks  # noqa: PLC0415
    dims = {k: int(v) for k, v in (d.split("=", 1) for d in args.dim)}
    work = args.work or tempfile.mkdtemp(prefix="kiln-resume-")
    os.makedirs(work, exist_ok=True)
    dbs = {"A uninterrupted": f"{work}/a.db", "B uninterrupted, seed 1": f"{work}/b.db",
           "R interrupted + resumed": f"{work}/r.db"}
    for p in dbs.values():
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(p + suffix):
                os.remove(p + suffix)
        shutil.rmtree(os.path.splitext(p)[0] + "-cache", ignore_errors=True)
    used = {}
    used["A uninterrupted"], _ = kiln_tune(args.model, dbs["A uninterrupted"], args.budget, 0, args.clock, args.dim)
    used["B uninterrupted, seed 1"], _ = kiln_tune(args.model, dbs["B uninterrupted, seed 1"], args.budget, 1,
                                                   args.clock, args.dim)
    first, out = kiln_tune(args.model, dbs["R interrupted + resumed"], args.budget, 0, args.clock, args.dim,
                           interrupt_after=args.budget / 2)
    if "interrupted" not in out:
        raise SystemExit(f"the run was not interrupted:\n{out[-2000:]}")
    second, _ = kiln_tune(args.model, dbs["R interrupted + resumed"], max(1.0, args.budget - first), 0, args.clock,
                          args.dim)
    used["R interrupted + resumed"] = first + second
    tasks = extract_tasks(args.model, dims)
    rounds = end_to_end(args.model, dims, dbs)
    med = {k: float(np.median(v)) for k, v in rounds.items()}
    spread = (max(rounds["untuned"]) - min(rounds["untuned"])) / med["untuned"]
    print(f"{os.path.basename(args.model)} {dims}, budget {args.budget:.0f} s per run, tuned with --clock "
          f"{args.clock}; end to end on one thread by thread CPU time (median of 5 interleaved rounds), "
          f"load {os.getloadavg()[0]:.1f}; interrupted after {first:.0f} s, resumed for {second:.0f} s")
    print("| run | tuning s | records | est. speedup | end-to-end ms | speedup | tasks with the same best as A |")
    print("|---|---|---|---|---|---|---|")
    print(f"| untuned | - | - | - | {med['untuned']:.3f} | x1.00 | - |")
    speed = {}
    _, _, best_a = estimated(tasks, dbs["A uninterrupted"], args.clock)
    for name, db in dbs.items():
        est, n, best = estimated(tasks, db, args.clock)
        speed[name] = med["untuned"] / med[name]
        same = sum(best.get(k) == v for k, v in best_a.items())
        print(f"| {name} | {used[name]:.0f} | {n} | x{est:.2f} | {med[name]:.3f} | x{speed[name]:.2f} | "
              f"{same}/{len(best_a)} |")
    a, b, r = (speed[k] for k in dbs)
    ok = abs(r - a) <= abs(b - a) + spread * a
    print(f"|R - A| = {abs(r - a):.3f}, |B - A| = {abs(b - a):.3f}, untuned rounds' spread {spread:.1%}: "
          f"{'the same result within noise' if ok else 'NOT within noise'}")


if __name__ == "__main__":
    main()
