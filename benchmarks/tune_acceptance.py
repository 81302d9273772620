"""Issue 16's acceptance checks in one command: tune models, then time them tuned and untuned
side by side with ONNX Runtime and OpenVINO (f32).

    python benchmarks/tune_acceptance.py [--budget 10m] [--work /tmp/kiln-tune-acceptance]
        [--models kws_dscnn:batch=8,tiny_cnn:batch=8,transformer_layer:batch=4:seq=64]   # the 3 slowest rows
    python benchmarks/tune_acceptance.py --models bench:resnet18,bench:gpt2_decoder      # ResNet-18, GPT-2-style

A model is a corpus name (its ONNX file from `python -m benchmarks.corpus build`, dims as in
`python -m benchmarks.corpus list`) or bench:NAME (benchmarks/models.py, its default shape). Per
model, on a quiet machine (the tuner times on the model's threads, --clock wall):

1. `kiln tune MODEL --dim ... --budget B --db WORK/MODEL-DIMS.db` through kiln.tuning.tune_model
   (an existing database is resumed: remove WORK for a fresh run);
2. kiln untuned (tuning=""), kiln tuned (tuning=that database), ORT and OpenVINO, --threads each,
   runs interleaved in rounds for about --seconds, medians; outputs checked against ORT.

Prints one markdown table (gain = untuned / tuned; the targets: gain >= 1.20 on the 3 slowest,
tuned / OpenVINO <= 0.8 on the bench: ones) and writes WORK/summary.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_MODELS = "kws_dscnn:batch=8,tiny_cnn:batch=8,transformer_layer:batch=4:seq=64"
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
    """A corpus model's ONNX file, or for "bench:NAME" one of benchmarks/models.py's built into `work`."""
    if name.startswith("bench:"):
        import onnx  # noqa: PLC0415
        from benchmarks.models import MODELS  # noqa: PLC0415
        path = os.path.join(work, name[6:] + ".onnx")
        if not os.path.exists(path):
            onnx.save(MODELS[name[6:]](**dims), path)
        return path
    from benchmarks.corpus.build import corpus_dir  # noqa: PLC0415
    return os.path.join(corpus_dir(), name + ".onnx")


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


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", default="10m", help="tuning budget per model (kiln tune --budget)")
    ap.add_argument("--models", default=DEFAULT_MODELS, help="name:dim=size:... comma-separated")
    ap.add_argument("--work", default="/tmp/kiln-tune-acceptance")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    ap.add_argument("--threads", type=int, default=2, help="threads of every engine in the comparison")
    ap.add_argument("--seconds", type=float, default=6.0, help="timed seconds per model in the comparison")
    args = ap.parse_args(argv)
    os.makedirs(args.work, exist_ok=True)
    from kiln.cli import _duration  # noqa: PLC0415
    from kiln.tuning import tune_model  # noqa: PLC0415
    budget = _duration(None, None, args.budget)
    results = []
    for name, dims in parse_models(args.models):
        model = model_path(name, dims, args.work)
        tag = name.replace("bench:", "")
        db = os.path.join(args.work, f"{tag}-{'-'.join(f'{k}{v}' for k, v in dims.items())}.db")
        print(f"== {name} {dims}: kiln tune {model} --budget {args.budget} --db {db} --clock {args.clock}", flush=True)
        t0 = time.perf_counter()
        rep = tune_model(model, db, budget, dims=None if name.startswith("bench:") else dims, clock=args.clock,
                         end_to_end=False)
        row = {"model": name, "dims": dims, "db": db, "tune_s": time.perf_counter() - t0,
               "trials": sum(s.trials for s in rep.tasks), "estimated": rep.estimated_speedup}
        row["bench"] = side_by_side(model, {} if name.startswith("bench:") else dims, db, args.threads, args.seconds)
        results.append(row)
        print(json.dumps(row, default=str), flush=True)
    with open(os.path.join(args.work, "summary.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)
    print(f"\nkiln tune --budget {args.budget} --clock {args.clock}; then {args.threads} threads each, "
          f"medians of interleaved runs (kiln.bench.time_interleaved), load {os.getloadavg()[0]:.1f}")
    print("| model | shape | tuning s | trials | est. | untuned ms | tuned ms | gain | ORT ms | OpenVINO ms | "
          "tuned / best peer | tuned / OpenVINO |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        b = r["bench"]
        peers = [b[k] for k in ("ort", "openvino") if k in b]
        ov = b.get("openvino")
        vs_ov = f"{b['tuned'] / ov:.2f}" if ov else "-"
        bad = "" if all(b["match"].values()) else f" (outputs differ from ORT: {b['match']})"
        print(f"| {r['model']} | {','.join(f'{k}={v}' for k, v in r['dims'].items())} | {r['tune_s']:.0f} | "
              f"{r['trials']} | x{r['estimated']:.2f} | {b['untuned']:.3f} | {b['tuned']:.3f} | "
              f"x{b['untuned'] / b['tuned']:.2f}{bad} | {b['ort']:.3f} | {f'{ov:.3f}' if ov else '-'} | "
              f"{b['tuned'] / min(peers):.2f} | {vs_ov} |")


if __name__ == "__main__":
    main()
