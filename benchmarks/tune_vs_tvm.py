"""kiln's tuner against TVM MetaSchedule on one GEMM: tuning time and speedup, side by side.

    python benchmarks/tune_vs_tvm.py [--n 1024] [--budget 300] [--tvm-trials 64] [--clock wall|cpu]

Both tune C = A @ B (float32, n x n x n, both operands inputs) on this machine:

- TVM: `meta_schedule.tune_tir` (apache-tvm from pip, its default evolutionary search and
  XGBoost model, the local builder and runner) for --tvm-trials trials, in a child process
  with a time limit of --budget seconds (a peer that hangs or fails is reported with its
  error); then the tuned and the untuned (naive TE) function are timed by TVM's own
  `time_evaluator`.
- kiln: `kiln tune` on a one-MatMul ONNX model for --budget seconds into a fresh database
  (kiln.tuning.tune_model, --clock as `kiln tune --clock`), then the untuned and tuned kernel
  times from its report and the whole model untuned vs tuned (its end-to-end check).

Prints a markdown table (tuning seconds, trials, untuned ms, tuned ms, speedup, GFLOP/s) and
writes --json. Under load, wall times are noise: `--clock cpu` times kiln on one thread by
thread CPU time (TVM's runner has no such mode: its figures then carry the load).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("KILN_TIER", "full")   # time the -O3 build, never a quick tier (kiln.codegen.tiers)


def _log_errors(work_dir: str, limit: int = 3) -> list[str]:
    """The first few distinct build/run errors MetaSchedule's task logs name (its records keep none)."""
    import glob  # noqa: PLC0415
    seen: list[str] = []
    for path in sorted(glob.glob(os.path.join(work_dir, "logs", "*task_0*.log"))):
        with open(path, errors="replace") as f:
            for line in f:
                if ("Error" in line or "Timeout" in line) and "[INFO]" not in line:
                    text = line.strip()[:300]
                    if text not in seen:
                        seen.append(text)
                if len(seen) >= limit:
                    return seen
    return seen


def _tvm_child(n: int, trials: int, threads: int, work_dir: str, q, build_timeout: float = 30.0) -> None:
    """MetaSchedule on the GEMM, in a child process; puts a dict (figures or the error) on q."""
    out: dict = {"engine": "TVM MetaSchedule"}
    try:
        os.environ["TVM_NUM_THREADS"] = str(threads)
        import numpy as np  # noqa: PLC0415
        import tvm  # noqa: PLC0415
        from tvm import te  # noqa: PLC0415
        from tvm.s_tir import meta_schedule as ms  # noqa: PLC0415
        out["version"] = tvm.__version__
        a = te.placeholder((n, n), name="A", dtype="float32")
        b = te.placeholder((n, n), name="B", dtype="float32")
        k = te.reduce_axis((0, n), name="k")
        c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
        func = te.create_prim_func([a, b, c])
        mod = tvm.IRModule({"main": func})
        target = tvm.target.Target({"kind": "llvm", "mcpu": _llvm_cpu(), "num-cores": threads})
        out["target"] = str(target)
        rng = np.random.default_rng(0)
        an, bn = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
        dev = tvm.cpu()

        def timed(exe, repeat: int = 5) -> float:
            lib = exe.mod   # tvm.compile's Executable: its runtime module
            args = [tvm.runtime.tensor(an, dev), tvm.runtime.tensor(bn, dev),
                    tvm.runtime.tensor(np.zeros((n, n), np.float32), dev)]
            f = lib["main"]
            f(*args)
            np.testing.assert_allclose(args[2].numpy(), an @ bn, rtol=1e-3, atol=1e-2)
            ev = lib.time_evaluator("main", dev, number=1, repeat=repeat)
            return float(min(ev(*args).results))
        t0 = time.perf_counter()
        db = ms.tune_tir(mod, target, work_dir, max_trials_global=trials, num_trials_per_iter=min(64, trials),
                         num_tuning_cores=threads, seed=0,
                         builder=ms.builder.LocalBuilder(timeout_sec=build_timeout),
                         runner=ms.runner.LocalRunner(timeout_sec=build_timeout))
        out["tuning_s"] = time.perf_counter() - t0
        records = db.get_all_tuning_records()
        out["records"] = len(records)
        out["valid_records"] = sum(1 for r in records if r.run_secs and all(float(s) < 1e9 for s in r.run_secs))
        q.put({**out, "partial": True})   # the tuning time, should the timing below run out of budget
        sch = ms.tir_integration.compile_tir(db, mod, target)
        if sch is None:
            out["error"] = f"MetaSchedule produced no valid schedule in {trials} trials ({len(records)} records)"
            out["log_errors"] = _log_errors(work_dir)
        else:
            out["tuned_s"] = timed(tvm.compile(sch.mod, target=target))
            q.put({**out, "partial": True})
        # the untuned function: TVM's default lowering of the TE compute (naive loops), timed once
        out["untuned_s"] = timed(tvm.compile(mod, target=target), repeat=1)
    except Exception as e:  # noqa: BLE001  a peer's failure is a result to report
        out["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:400]
        out["traceback"] = traceback.format_exc()[-2000:]
    q.put(out)


def _llvm_cpu() -> str:
    """The host's CPU name as LLVM knows it (TVM's llvm)."""
    try:
        import tvm  # noqa: PLC0415
        return str(tvm.get_global_func("target.llvm_get_system_cpu")())
    except Exception:  # noqa: BLE001
        return "x86-64-v3"


def run_tvm(n: int, trials: int, budget: float, threads: int, build_timeout: float = 30.0,
            keep: str | None = None) -> dict:
    """MetaSchedule's figures, or {"error": ...} (not installed, failed, or past `budget` s)."""
    try:
        import tvm  # noqa: F401,PLC0415
        from tvm.s_tir import meta_schedule  # noqa: F401,PLC0415
    except ImportError as e:
        return {"engine": "TVM MetaSchedule", "error": f"not installed ({e}); pip install apache-tvm"}
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="kiln-tvm-") as tmp:
        work = keep or tmp   # (--tvm-work: its logs kept)
        p = ctx.Process(target=_tvm_child, args=(n, trials, threads, work, q, build_timeout))
        t0 = time.perf_counter()
        p.start()
        last = None
        while p.is_alive() and time.perf_counter() - t0 < budget:
            try:
                last = q.get(timeout=1)
            except Exception:  # noqa: BLE001  (queue.Empty)
                continue
            if not last.get("partial"):
                break
        p.join(max(1.0, budget - (time.perf_counter() - t0)))
        if p.is_alive():
            p.kill()
            p.join()
        while last is None or last.get("partial"):
            try:
                last = q.get(timeout=2)
            except Exception:  # noqa: BLE001
                break
        if last is None:
            return {"engine": "TVM MetaSchedule", "tuning_s": time.perf_counter() - t0,
                    "error": f"no result within the {budget:.0f} s budget" if p.exitcode in (None, -9)
                    else f"the tuning process died (exit code {p.exitcode})", "log_errors": _log_errors(work)}
        if last.get("partial"):
            last["error"] = f"tuned in {last['tuning_s']:.0f} s, but timing it ran past the {budget:.0f} s budget"
        return last


def gemm_model(n: int):
    import onnx  # noqa: PLC0415
    from onnx import helper  # noqa: PLC0415
    f = onnx.TensorProto.FLOAT
    g = helper.make_graph([helper.make_node("MatMul", ["A", "B"], ["C"], name="gemm")], "gemm",
                          [helper.make_tensor_value_info("A", f, [n, n]), helper.make_tensor_value_info("B", f, [n, n])],
                          [helper.make_tensor_value_info("C", f, [n, n])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def run_kiln(n: int, budget: float, clock: str, db: str) -> dict:
    from kiln.tuning import tune_model  # noqa: PLC0415
    t0 = time.perf_counter()
    rep = tune_model(gemm_model(n), db, budget, clock=clock, end_to_end=clock == "wall")
    out = {"engine": f"kiln tune ({clock} clock)", "tuning_s": time.perf_counter() - t0,
           "threads": 1 if clock == "cpu" else None,
           "trials": sum(s.trials for s in rep.tasks), "tau": rep.mean_tau}
    main = max(rep.tasks, key=lambda s: (s.default_s or 0) * s.task.weight)
    out["untuned_s"], out["tuned_s"] = main.default_s, main.best_s or main.default_s
    out["kernel"] = main.task.description
    out["best"] = main.best
    if rep.end_to_end:
        out["end_to_end"] = rep.end_to_end
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--budget", type=float, default=300.0, help="seconds for each tuner")
    ap.add_argument("--tvm-trials", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="kiln's measurement clock")
    ap.add_argument("--tvm-build-timeout", type=float, default=30.0,
                    help="seconds MetaSchedule's local builder and runner give a candidate (its default: 30)")
    ap.add_argument("--tvm-work", default=None, help="MetaSchedule's work directory, kept (default: a temporary one)")
    ap.add_argument("--only", choices=("tvm", "kiln"), default=None)
    ap.add_argument("--db", default=None, help="kiln's records database (default: a fresh temporary one)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    flops = 2 * args.n ** 3
    rows = []
    if args.only != "kiln":
        rows.append(run_tvm(args.n, args.tvm_trials, args.budget, args.threads, args.tvm_build_timeout, args.tvm_work))
    if args.only != "tvm":
        with tempfile.TemporaryDirectory(prefix="kiln-tune-") as tmp:
            rows.append(run_kiln(args.n, args.budget, args.clock, args.db or os.path.join(tmp, "t.db")))
    print(f"GEMM {args.n}^3 float32, {args.threads} threads, load {os.getloadavg()[0]:.1f}")
    print("| tuner | threads | tuning s | untuned ms | tuned ms | speedup | tuned GFLOP/s | note |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        u, t = r.get("untuned_s"), r.get("tuned_s")

        def ms(v):
            return f"{v * 1e3:.2f}" if v else "-"
        print(f"| {r['engine']}{' ' + r['version'] if r.get('version') else ''} | {r.get('threads') or args.threads} | {r.get('tuning_s', 0):.0f} | {ms(u)} | {ms(t)} | "
              f"{f'x{u / t:.2f}' if u and t else '-'} | {f'{flops / t / 1e9:.0f}' if t else '-'} | "
              f"{r.get('error', '')} |")
    for r in rows:
        for e in r.get("log_errors") or []:
            print(f"  {r['engine']} log: {e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"n": args.n, "threads": args.threads, "load": os.getloadavg()[0], "rows": rows}, f,
                      indent=1, default=str)


if __name__ == "__main__":
    main()
