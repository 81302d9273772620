"""Issue 16's acceptance checks: tune models, then time them tuned and untuned side by side
with ONNX Runtime and OpenVINO (f32).

Two phases over one --work directory, so that the tuning (long, fine on a loaded machine with
--clock cpu) and the timing (a few minutes, needs a quiet one) can run at different times:

    python benchmarks/tune_acceptance.py --phase tune --clock cpu --budget 10m --work W --models M
    python benchmarks/tune_acceptance.py --phase time --work W --models M      # quiet machine
    python benchmarks/tune_acceptance.py --models M                            # both (--phase all)

--models: comma-separated name:dim=size:...; a name is a corpus model (its ONNX file from
`python -m benchmarks.corpus build`, dims as in `python -m benchmarks.corpus list`), bench:NAME
(benchmarks/models.py, its default shape, built into W) or a path to an .onnx file. E.g. the
3 rows slowest against ORT in a corpus run, and issue 16's second check:

    --models bilstm:seq=128:batch=8,lstm_stacked:seq=128:batch=8,resnext50_32x4d:batch=4
    --models bench:resnet18,bench:gpt2_decoder

Phase tune, per model: `kiln tune MODEL --dim ... --budget B --db W/TAG.db --clock C` through
kiln.tuning.tune_model, then (unless --no-end-to-end) its end-to-end check (--clock cpu: one
thread, thread CPU time); writes W/TAG.tune.json (tasks, trials, per-task speedups, the
estimate). A model with a W/TAG.tune.json is skipped (each model is tuned once, for B; an
interrupted one has none: its run goes on from the records, for B again).

Phase time, per model: kiln untuned (tuning=""), kiln tuned (tuning=W/TAG.db), ORT and OpenVINO,
--threads each, runs interleaved in rounds for about --seconds, medians; outputs checked against
ORT. About 20-40 s per model on a quiet machine (two kiln compiles, OpenVINO's load, 6 s timed): the
five models above took 321 s at load 15.6 (83 s of CPU), ResNeXt-50 batch 4 185 s of it.
Prints one markdown table (gain = untuned / tuned; the targets: gain >= 1.20 on the 3 slowest,
tuned / OpenVINO <= 0.8 on the bench: ones) and writes W/summary.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("KILN_TIER", "full")   # time the -O3 build, never a quick tier (kiln.codegen.tiers)
DEFAULT_MODELS = "bilstm:seq=128:batch=8,lstm_stacked:seq=128:batch=8,resnext50_32x4d:batch=4"
# issue 16's second check: benchmarks/models.py's ResNet-18 and GPT-2-style decoder (their default shapes)
BENCH_MODELS = "bench:resnet18,bench:gpt2_decoder"


def parse_models(text: str) -> list[tuple[str, dict]]:
    out = []
    for item in text.split(","):
        item = item.strip()
        prefix = "bench:" if item.startswith("bench:") else ""
        name, *dims = item[len(prefix):].split(":")
        name = prefix + name
        out.append((name, {k: int(v) for k, v in (d.split("=", 1) for d in dims)}))
    return out


def model_path(name: str, dims: dict, work: str) -> str:
    """A corpus model's ONNX file, an .onnx path as given, or for "bench:NAME" one of
    benchmarks/models.py's built into `work`."""
    if name.endswith(".onnx"):
        return name
    if name.startswith("bench:"):
        import onnx  # noqa: PLC0415
        from benchmarks.models import MODELS  # noqa: PLC0415
        path = os.path.join(work, name[6:] + ".onnx")
        if not os.path.exists(path):
            onnx.save(MODELS[name[6:]](**dims), path)
        return path
    from benchmarks.corpus.build import corpus_dir  # noqa: PLC0415
    return os.path.join(corpus_dir(), name + ".onnx")


def tag_of(name: str, dims: dict) -> str:
    """The model's files in the work directory: TAG.db, TAG.tune.json."""
    base = os.path.splitext(os.path.basename(name))[0] if name.endswith(".onnx") else name.replace("bench:", "")
    return "-".join([base, *(f"{k}{v}" for k, v in dims.items())])


def model_dims(name: str, dims: dict) -> dict | None:
    """What the tuner binds: a bench: model has fixed shapes."""
    return None if name.startswith("bench:") else dims


def side_by_side(path: str, dims: dict, db: str, threads: int, seconds: float) -> dict:
    """kiln untuned, kiln tuned, ONNX Runtime and OpenVINO (f32), `threads` threads each, runs
    interleaved in rounds (kiln.bench.time_interleaved), medians in ms; outputs checked against ORT."""
    import kiln  # noqa: PLC0415
    from kiln.bench import compare, ort_session, time_interleaved  # noqa: PLC0415
    from kiln.tuning import random_feeds  # noqa: PLC0415
    untuned, tuned = kiln.compile(path, tuning=""), kiln.compile(path, tuning=db)
    feeds = random_feeds(untuned, dims)
    sess = ort_session(path, threads)
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    fns = {"untuned": lambda: untuned.run(feeds), "tuned": lambda: tuned.run(feeds),
           "ort": lambda: sess.run(None, feeds)}
    out: dict = {"match": {k: compare(m.run(feeds), want)["ok"] for k, m in (("untuned", untuned), ("tuned", tuned))}}
    try:
        from benchmarks.corpus.run import openvino_runner  # noqa: PLC0415
        ov, _ = openvino_runner(path, feeds, threads)
        fns["openvino"] = lambda: ov(feeds)
    except Exception as e:  # noqa: BLE001  a peer that cannot run is reported, not fatal
        out["openvino_error"] = f"{type(e).__name__}: {e}".splitlines()[0]
    t = time.perf_counter()
    for f in fns.values():
        f()
    once = (time.perf_counter() - t) / len(fns)
    runs = max(10, int(seconds / max(once, 1e-5) / len(fns)))
    times = time_interleaved(fns, {k: runs for k in fns}, rounds=10)
    out.update({k: float(np.median(v)) for k, v in times.items()})
    return out


def tune_phase(name: str, dims: dict, args) -> dict | None:
    """Tune one model into W/TAG.db and write W/TAG.tune.json (None: interrupted, nothing written)."""
    from kiln.tuning import tune_model  # noqa: PLC0415
    tag = tag_of(name, dims)
    db, out = os.path.join(args.work, tag + ".db"), os.path.join(args.work, tag + ".tune.json")
    if os.path.exists(out):
        print(f"== {name} {dims}: tuned already ({out}); skipped", flush=True)
        with open(out) as f:
            return json.load(f)
    model = model_path(name, dims, args.work)
    print(f"== {name} {dims}: kiln tune {model} --budget {args.budget_s:.0f}s --db {db} --clock {args.clock}",
          flush=True)
    last = [0.0]

    def progress(rep, elapsed):
        if elapsed - last[0] >= 60:
            last[0] = elapsed
            live = [s for s in rep.tasks if s.default_s]
            print(f"   {elapsed:4.0f} s: {len(rep.tasks)} tasks, {sum(s.trials for s in rep.tasks)} trials, best "
                  f"task x{max((s.speedup for s in live), default=1):.2f}, est. x{rep.estimated_speedup:.2f}",
                  flush=True)
    t0 = time.perf_counter()
    rep = tune_model(model, db, args.budget_s, dims=model_dims(name, dims), clock=args.clock,
                     end_to_end=args.end_to_end, on_progress=progress)
    if rep.interrupted:
        print(f"   interrupted: run the tune phase again to go on from {db}", flush=True)
        return None
    row = {"model": name, "dims": dims, "db": db, "clock": args.clock, "budget_s": args.budget_s,
           "tune_s": time.perf_counter() - t0, "trials": sum(s.trials for s in rep.tasks),
           "estimated": rep.estimated_speedup, "tau": rep.mean_tau, "end_to_end": rep.end_to_end,
           "tasks": [{"key": s.task.key, "kernel": s.task.description, "weight": s.task.weight,
                      "default_us": s.default_s and s.default_s * 1e6, "best_us": s.best_s and s.best_s * 1e6,
                      "speedup": s.speedup, "trials": s.trials, "failures": s.failures, "note": s.note}
                     for s in rep.tasks],
           "passes": [{"key": t.key, "decision": t.decision, "kernel": t.description, "weight": t.weight,
                       "rule": t.default, "best": t.best, "ms": {str(a): v * 1e3 for a, v in t.seconds.items()},
                       "errors": {str(a): e for a, e in t.errors.items()}} for t in rep.passes]}
    with open(out, "w") as f:
        json.dump(row, f, indent=1, default=str)
    print_tune(row)
    return row


def print_tune(row: dict) -> None:
    """The tune phase's per-task figures (the tuner's clock) and its end-to-end check."""
    print(f"   {row['tune_s']:.0f} s, {row['trials']} trials, estimated end-to-end x{row['estimated']:.2f} "
          f"(kernel times x weights), Kendall tau {row['tau']:.2f}")
    for t in sorted(row["tasks"], key=lambda t: -(t["weight"] * (t["default_us"] or 0))):
        if t["default_us"]:
            print(f"   {t['key'][:8]} x{t['weight']:<3} {t['default_us']:10.1f} us -> {t['best_us']:10.1f} us "
                  f"x{t['speedup']:.2f}  {t['trials']:3} trials  {t['kernel'][:90]}")
    for p in row["passes"]:
        print(f"   {p['key'][:13]} x{p['weight']:<3} {p['decision']} rule {p['rule']} best {p['best']}: "
              + ", ".join(f"{a} {ms:.3f} ms" for a, ms in p["ms"].items()))
    e = row.get("end_to_end")
    if e:
        print(f"   end to end ({e.get('clock')}, median of {e.get('runs')}): {e['untuned'] * 1e3:.3f} ms -> "
              f"{e['tuned'] * 1e3:.3f} ms (x{e['speedup']:.2f}), outputs {'match' if e['outputs_match'] else 'DIFFER'}",
              flush=True)


def time_phase(name: str, dims: dict, args) -> dict:
    """One model untuned, tuned (W/TAG.db), ORT and OpenVINO side by side (side_by_side)."""
    tag = tag_of(name, dims)
    db = os.path.join(args.work, tag + ".db")
    if not os.path.exists(db):
        raise SystemExit(f"{db} not found: run --phase tune first")
    row: dict = {"model": name, "dims": dims, "db": db}
    try:
        with open(os.path.join(args.work, tag + ".tune.json")) as f:
            tuned = json.load(f)
        row.update({k: tuned[k] for k in ("tune_s", "trials", "estimated")})
    except FileNotFoundError:
        pass
    t0 = time.perf_counter()
    row["bench"] = side_by_side(model_path(name, dims, args.work), {} if name.startswith("bench:") else dims, db,
                                args.threads, args.seconds)
    row["time_s"] = time.perf_counter() - t0
    print(json.dumps(row, default=str), flush=True)
    return row


def print_table(results: list[dict], args) -> None:
    print(f"\nkiln tune --clock {args.clock}; then {args.threads} threads each, medians of interleaved runs "
          f"(kiln.bench.time_interleaved), load {os.getloadavg()[0]:.1f}")
    print("| model | shape | tuning s | trials | est. | untuned ms | tuned ms | gain | ORT ms | OpenVINO ms | "
          "tuned / best peer | tuned / OpenVINO |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        b = r["bench"]
        peers = [b[k] for k in ("ort", "openvino") if k in b]
        ov = b.get("openvino")
        vs_ov = f"{b['tuned'] / ov:.2f}" if ov else "-"
        bad = "" if all(b["match"].values()) else f" (outputs differ from ORT: {b['match']})"
        tune_s, est = r.get("tune_s"), r.get("estimated")
        print(f"| {r['model']} | {','.join(f'{k}={v}' for k, v in r['dims'].items())} | "
              f"{f'{tune_s:.0f}' if tune_s is not None else '-'} | {r.get('trials', '-')} | "
              f"{f'x{est:.2f}' if est is not None else '-'} | {b['untuned']:.3f} | {b['tuned']:.3f} | "
              f"x{b['untuned'] / b['tuned']:.2f}{bad} | {b['ort']:.3f} | {f'{ov:.3f}' if ov else '-'} | "
              f"{b['tuned'] / min(peers):.2f} | {vs_ov} |")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phase", choices=("tune", "time", "all"), default="all",
                    help="tune (loaded machine is fine with --clock cpu), time (a quiet machine), or both")
    ap.add_argument("--budget", default="10m", help="tuning budget per model (kiln tune --budget)")
    ap.add_argument("--models", default=DEFAULT_MODELS, help="name:dim=size:... comma-separated")
    ap.add_argument("--work", default="/tmp/kiln-tune-acceptance")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    ap.add_argument("--end-to-end", action=argparse.BooleanOptionalAction, default=True,
                    help="tune phase: time the model untuned and tuned after tuning it (on the tuner's clock)")
    ap.add_argument("--threads", type=int, default=2, help="threads of every engine in the comparison")
    ap.add_argument("--seconds", type=float, default=6.0, help="timed seconds per model in the comparison")
    args = ap.parse_args(argv)
    os.makedirs(args.work, exist_ok=True)
    from kiln.cli import _duration  # noqa: PLC0415
    args.budget_s = _duration(None, None, args.budget)
    models = parse_models(args.models)
    if args.phase in ("tune", "all"):
        for name, dims in models:
            tune_phase(name, dims, args)
    if args.phase in ("time", "all"):
        t0 = time.perf_counter()
        results = [time_phase(name, dims, args) for name, dims in models]
        with open(os.path.join(args.work, "summary.json"), "w") as f:
            json.dump(results, f, indent=1, default=str)
        print_table(results, args)
        print(f"(time phase: {time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
