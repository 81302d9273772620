"""Cold and warm compile time of the benchmark models, per pipeline stage.

    python benchmarks/compile_time.py [--models resnet18,mlp] [--repeat 3] [--json out.json]
    python benchmarks/compile_time.py --models mobilenetv2 --kernels 10

Each model is saved as an .onnx file and measured in a fresh Python process (numpy and the
inputs loaded, nothing of kiln imported yet): "cold" is `import kiln`, kiln.compile(path)
and the first run on an empty cache (KILN_CACHE_DIR pointed at a new folder), "warm" the
same again in that process on the cache it filled, "warm new process" the same, imports
included, in another fresh process on that cache (marked if it imported onnx: a hit finds
the model by the file's identity without reading it). Per stage (kiln.timing): wall
and CPU seconds, CPU counting the C compilers too: on a shared machine wall time grows
with the load (printed), CPU time much less (the warm new process's CPU seconds, all
its threads, are printed beside its wall time). With --repeat N the row with the median
cold wall time is shown, and every run is in the JSON. A big module is built at a quick tier
first (kiln.codegen.tiers): "cold s" is then the time to the first (correct) result, "final tier
s" the time until its -O3 build serves (`wait_optimized`), after which the warm compiles run.
`--tier full` measures the -O3 build alone (the cold compile before tiering).

kiln's own .py files are byte-compiled ahead (kiln/**/__pycache__, as `pip install` does at
install time, and as site-packages' numpy and onnx are), so `import kiln` reads bytecode; where
PYTHONDONTWRITEBYTECODE=1 and no __pycache__ exists, a new process compiles each kiln module it
imports from source (0.6-0.9 s of CPU for a model's 170 modules). --source-imports measures
that instead (the child looks for bytecode in an empty PYTHONPYCACHEPREFIX).

--kernels N: instead, the N kernels of each model the C compiler takes longest over,
each compiled alone with the module's header and flags (CPU seconds, the header's own
cost taken off): where a lowering's code shape costs compile time.
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


def one(path: str, feeds_path: str, cache: str) -> dict:
    """In this process: compile the model file `path` and run it once, twice; the stage times
    of each. The first is timed from `import kiln` on (numpy and the inputs, the user's, are
    loaded before): what a new process pays, imports included."""
    import time

    import numpy as np
    sys.path.insert(0, ROOT)
    os.environ["KILN_CACHE_DIR"] = cache
    with np.load(feeds_path) as f:
        feeds = dict(f)
    out = {}
    for run in ("first", "second"):
        runs = _compiler_runs()
        t, cpu = time.perf_counter(), time.process_time()
        import kiln
        from kiln.timing import recording
        with recording() as times:
            model = kiln.compile(path)
            model.run(feeds)
        out[run] = {"wall_s": time.perf_counter() - t, "cpu_s": time.process_time() - cpu,
                    "compiler_runs": _compiler_runs() - runs, "stages": times.to_json(),
                    "onnx_imported": "onnx" in sys.modules, "tier": model.tier}
        model.wait_optimized()   # (then the warm compiles find the -O3 module cached)
        out[run]["final_s"] = time.perf_counter() - t
    return out


def _compiler_runs() -> int:
    """C compiler processes started so far (none if kiln's builder was never imported: read
    without importing it, which a warm compile does not need)."""
    build = sys.modules.get("kiln.codegen.build")
    return build.compiler_runs() if build is not None else 0


def child_env(source_imports: bool, scratch: str, tier: str | None = None) -> dict:
    """The measured processes' environment: kiln's bytecode compiled ahead and read, or
    (`source_imports`) every kiln module compiled at import (an empty bytecode prefix);
    KILN_TIER=`tier` (None: kiln's default, though benchmarks/__init__.py sets "full")."""
    env = dict(os.environ)
    env.pop("KILN_TIER", None)
    if tier is not None:
        env["KILN_TIER"] = tier
    if source_imports:
        env.update(PYTHONPYCACHEPREFIX=os.path.join(scratch, "no-bytecode"), PYTHONDONTWRITEBYTECODE="1")
    else:
        import compileall
        compileall.compile_dir(os.path.join(ROOT, "kiln"), quiet=1)
        env.pop("PYTHONPYCACHEPREFIX", None)
    return env


def measure(name: str, source_imports: bool = False, tier: str | None = None) -> dict:
    """Cold then warm in one fresh process, then warm in another, on the model saved as a file
    (kiln.compile(path), as users call it: a warm compile then finds it by the file's identity)."""
    import time

    import numpy as np
    import onnx

    from benchmarks.models import MODELS, inputs_for
    from kiln.codegen.cachedir import RACY_NS
    with tempfile.TemporaryDirectory(prefix="kiln-cold-") as cache:
        model = MODELS[name]()
        path, feeds = os.path.join(cache, f"{name}.onnx"), os.path.join(cache, f"{name}.npz")
        onnx.save(model, path)
        np.savez(feeds, **inputs_for(name, model))
        # a file written under RACY_NS ago is not yet remembered by its identity (a model file
        # is usually older than that): wait so the cold compile may remember it
        time.sleep(max(0.0, (os.stat(path).st_ctime_ns + RACY_NS - time.time_ns()) / 1e9))

        env = child_env(source_imports, cache, tier)

        def child() -> dict:
            r = subprocess.run([sys.executable, __file__, "--child", path, feeds, cache], capture_output=True,
                               text=True, cwd=ROOT, env=env)
            if r.returncode != 0:
                raise RuntimeError(f"{name}: {r.stderr[-2000:]}")
            return json.loads(r.stdout.strip().split("\n")[-1])
        first = child()
        again = child()
    return {"model": name, "load": os.getloadavg()[0], "cold": first["first"], "warm": first["second"],
            "warm_new_process": again["first"], "source_imports": source_imports, "tier": tier}


def kernel_costs(name: str, top: int) -> None:
    """Print the `top` kernels of model `name` slowest to compile, at -O3 and (for scale) -O1."""
    import resource

    from benchmarks.models import MODELS
    from kiln.codegen.build import _cc, _flags
    from kiln.codegen.c import _emit, compile_cost
    from kiln.compiler import run_stages
    from kiln.targets.target import Target
    module = run_stages(MODELS[name](), "loops").lowered.module
    header, bodies, shared = _emit(module, split_shared=True)
    flags = [f for f in _flags(None, Target.host()) if f != "-shared"]

    def cpu(text: str, level: str) -> float:
        with tempfile.TemporaryDirectory() as d:
            with open(f"{d}/k.c", "w") as f:
                f.write(text)
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run([*_cc(None), *[level if f == "-O3" else f for f in flags], "-c", "-o", f"{d}/k.o",
                            f"{d}/k.c"], check=True)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    base = {lv: cpu(header, lv) for lv in ("-O3", "-O1")}
    names = [f.name for f in module.funcs] + ["(runtime)"] * (len(bodies) - len(module.funcs))
    rows = [(cpu(header + b, "-O3") - base["-O3"], cpu(header + b, "-O1") - base["-O1"], n, b)
            for n, b in zip(names, bodies)]
    # a shared kernel's unit (compiled once per machine, whatever its callers): alone
    rows += [(cpu(u, "-O3"), cpu(u, "-O1"), "(shared unit)", u) for u in shared]
    rows.sort(key=lambda r: -r[0])
    print(f"{name}: {len(bodies)} functions, {sum(r[0] for r in rows):.2f} s of CPU at -O3 "
          f"({sum(r[1] for r in rows):.2f} at -O1), header alone {base['-O3'] * 1e3:.0f} ms per unit")
    for o3, o1, n, b in rows[:top]:
        print(f"  {o3 * 1e3:7.0f} ms -O3 {o1 * 1e3:6.0f} ms -O1  cost guess {compile_cost(b):8.0f}  {n}")


def fmt(row: dict) -> list[str]:
    c = row["cold"]
    cpu = sum(s["cpu_s"] for s in c["stages"].values())
    top = sorted(c["stages"].items(), key=lambda kv: -kv[1]["wall_s"])[:4]
    w = row["warm_new_process"]
    return [row["model"], f"{c['wall_s']:.2f}", f"{c.get('final_s', c['wall_s']):.2f}", f"{cpu:.2f}",
            str(c["compiler_runs"]),
            f"{row['warm']['wall_s']:.3f}",
            f"{w['wall_s']:.3f} ({w['cpu_s']:.3f})" + (" onnx imported" if w["onnx_imported"] else ""),
            f"{row['load']:.1f}",
            ", ".join(f"{k} {v['wall_s']:.2f}" for k, v in top)]


def main(argv=None) -> list[dict]:
    if argv is None and sys.argv[1:2] == ["--child"]:
        print(json.dumps(one(*sys.argv[2:5])))
        return []
    sys.path.insert(0, ROOT)
    from benchmarks.models import MODELS
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--kernels", type=int, metavar="N", help="the N kernels slowest to compile, per model")
    p.add_argument("--tier", choices=("auto", "full"), help="kiln.compile's tier (default: kiln's, tiered)")
    p.add_argument("--source-imports", action="store_true",
                   help="kiln's modules compiled from source at import (no bytecode ahead)")
    args = p.parse_args(argv)
    if args.kernels:
        for name in args.models.split(","):
            kernel_costs(name, args.kernels)
        return []
    rows, shown = [], []
    for name in args.models.split(","):
        runs = [measure(name, args.source_imports, args.tier) for _ in range(args.repeat)]
        rows += runs
        shown.append(sorted(runs, key=lambda r: r["cold"]["wall_s"])[len(runs) // 2])
        print(f"done {name}: cold {statistics.median(r['cold']['wall_s'] for r in runs):.2f} s",
              file=sys.stderr, flush=True)
    head = ["model", "cold s", "final tier s", "cold cpu s", "cc runs", "warm s", "warm new proc s (cpu)", "load",
            "slowest cold stages (wall s)"]
    lines = [head] + [fmt(r) for r in shown]
    widths = [max(len(x[k]) for x in lines) for k in range(len(head))]
    print(f"cold = import kiln + compile(model file) + first run, empty cache, fresh process; median of {args.repeat}; "
          f"{os.cpu_count()} cores; kiln's modules "
          + ("compiled from source at import (--source-imports)" if args.source_imports else
             "byte-compiled ahead, as pip install does (--source-imports: compiled at import)"))
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
