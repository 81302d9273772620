"""Cold and warm compile time of the benchmark models, per pipeline stage.

    python benchmarks/compile_time.py [--models resnet18,mlp] [--repeat 3] [--json out.json]

Each model is measured in a fresh Python process (kiln imported, nothing compiled yet):
"cold" is kiln.compile plus the first run on an empty cache (KILN_CACHE_DIR pointed at a
new folder), "warm" the same again in that process on the cache it filled, "warm new
process" the same in another fresh process on that cache. Per stage (kiln.timing): wall
and CPU seconds, CPU counting the C compilers too: on a shared machine wall time grows
with the load (printed), CPU time much less. With --repeat N the row with the median
cold wall time is shown, and every run is in the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def one(name: str, cache: str) -> dict:
    """In this process: compile `name` and run it once, twice; the stage times of each."""
    import time

    sys.path.insert(0, ROOT)
    import kiln
    from benchmarks.models import MODELS, inputs_for
    from kiln.codegen.build import compiler_runs
    from kiln.timing import recording
    os.environ["KILN_CACHE_DIR"] = cache
    model = MODELS[name]()
    feeds = inputs_for(name, model)
    out = {}
    for run in ("first", "second"):
        runs = compiler_runs()
        t = time.perf_counter()
        with recording() as times:
            kiln.compile(model).run(feeds)
        out[run] = {"wall_s": time.perf_counter() - t, "compiler_runs": compiler_runs() - runs,
                    "stages": times.to_json()}
    return out


def measure(name: str) -> dict:
    """Cold then warm in one fresh process, then warm in another."""
    with tempfile.TemporaryDirectory(prefix="kiln-cold-") as cache:
        def child() -> dict:
            r = subprocess.run([sys.executable, __file__, "--child", name, cache], capture_output=True,
                               text=True, cwd=ROOT)
            if r.returncode != 0:
                raise RuntimeError(f"{name}: {r.stderr[-2000:]}")
            return json.loads(r.stdout.strip().split("\n")[-1])
        first = child()
        again = child()
    return {"model": name, "load": os.getloadavg()[0], "cold": first["first"], "warm": first["second"],
            "warm_new_process": again["first"]}


def fmt(row: dict) -> list[str]:
    c = row["cold"]
    cpu = sum(s["cpu_s"] for s in c["stages"].values())
    top = sorted(c["stages"].items(), key=lambda kv: -kv[1]["wall_s"])[:4]
    return [row["model"], f"{c['wall_s']:.2f}", f"{cpu:.2f}", str(c["compiler_runs"]),
            f"{row['warm']['wall_s']:.3f}", f"{row['warm_new_process']['wall_s']:.3f}", f"{row['load']:.1f}",
            ", ".join(f"{k} {v['wall_s']:.2f}" for k, v in top)]


def main(argv=None) -> list[dict]:
    if argv is None and sys.argv[1:2] == ["--child"]:
        print(json.dumps(one(sys.argv[2], sys.argv[3])))
        return []
    sys.path.insert(0, ROOT)
    from benchmarks.models import MODELS
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    rows, shown = [], []
    for name in args.models.split(","):
        runs = [measure(name) for _ in range(args.repeat)]
        rows += runs
        shown.append(sorted(runs, key=lambda r: r["cold"]["wall_s"])[len(runs) // 2])
        print(f"done {name}: cold {statistics.median(r['cold']['wall_s'] for r in runs):.2f} s",
              file=sys.stderr, flush=True)
    head = ["model", "cold s", "cold cpu s", "cc runs", "warm s", "warm new proc s", "load",
            "slowest cold stages (wall s)"]
    lines = [head] + [fmt(r) for r in shown]
    widths = [max(len(x[k]) for x in lines) for k in range(len(head))]
    print(f"cold = compile + first run, empty cache, fresh process; median of {args.repeat}; "
          f"{os.cpu_count()} cores")
    for line in lines:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths)))
    for r in shown:
        print(f"\n{r['model']} cold stages (wall ms / cpu ms):")
        for k, v in r["cold"]["stages"].items():
            print(f"  {k:<12} {v['wall_s'] * 1e3:8.1f} {v['cpu_s'] * 1e3:8.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return rows


if __name__ == "__main__":
    main()
