"""Issue 16's first acceptance check in one command: tune the corpus models where untuned kiln is
slowest against the best peer, then time them tuned and untuned, and against ORT and OpenVINO.

    python benchmarks/tune_acceptance.py [--budget 10m] [--work /tmp/kiln-tune-acceptance]
                                         [--models kws_dscnn:batch=8,tiny_cnn:batch=8,transformer_layer:batch=4:seq=64]

Per model (a corpus ONNX file, `python -m benchmarks.corpus build` makes them), on a quiet
machine (the tuner times on the model's threads: --clock wall):

1. `kiln tune MODEL --dim ... --budget B --db WORK/MODEL.db` (resumes if the database exists:
   remove it for a fresh run), then its own end-to-end check: the model untuned and tuned,
   runs interleaved for --e2e seconds, medians (the "gain" column);
2. `python -m benchmarks.corpus run --only MODEL` untuned and with KILN_TUNING_DB=WORK/MODEL.db
   (ORT and OpenVINO side by side, 2 threads): kiln / best peer before and after, for the tuned case.

Prints one markdown table and writes WORK/summary.json. The target: gain >= 1.20 on each.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODELS = "kws_dscnn:batch=8,tiny_cnn:batch=8,transformer_layer:batch=4:seq=64"


def parse_models(text: str) -> list[tuple[str, dict]]:
    out = []
    for item in text.split(","):
        name, *dims = item.strip().split(":")
        out.append((name, {k: int(v) for k, v in (d.split("=", 1) for d in dims)}))
    return out


def corpus_row(name: str, dims: dict, db: str | None, work: str) -> dict | None:
    """The corpus harness's row for `name` at `dims` (untuned, or tuned with `db`)."""
    path = os.path.join(work, f"{name}-{'tuned' if db else 'untuned'}.json")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    env.pop("KILN_TUNING_DB", None)
    if db:
        env["KILN_TUNING_DB"] = db
    p = subprocess.run([sys.executable, "-m", "benchmarks.corpus", "run", "--only", name, "--budget", "2",
                        "--json", path], env=env, cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0 or not os.path.exists(path):
        print(f"corpus run of {name} failed:\n{(p.stdout + p.stderr)[-2000:]}", file=sys.stderr)
        return None
    with open(path) as f:
        rows = json.load(f).get("results", [])
    want = {k: str(v) for k, v in dims.items()}
    for r in rows:
        case = dict(kv.split("=", 1) for kv in str(r.get("shape", "")).split(",") if "=" in kv)
        if {k: v for k, v in case.items() if k in want} == want:
            return r
    print(f"no corpus row of {name} at {dims} in {path}", file=sys.stderr)
    return None


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", default="10m", help="tuning budget per model (kiln tune --budget)")
    ap.add_argument("--models", default=DEFAULT_MODELS, help="name:dim=size:... comma-separated")
    ap.add_argument("--work", default="/tmp/kiln-tune-acceptance")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    ap.add_argument("--no-peers", dest="peers", action="store_false", help="skip the corpus runs")
    args = ap.parse_args(argv)
    os.makedirs(args.work, exist_ok=True)
    from benchmarks.corpus.build import corpus_dir  # noqa: PLC0415
    from kiln.cli import _duration  # noqa: PLC0415
    from kiln.tuning import tune_model  # noqa: PLC0415
    budget = _duration(None, None, args.budget)
    results = []
    for name, dims in parse_models(args.models):
        model = os.path.join(corpus_dir(), name + ".onnx")
        db = os.path.join(args.work, f"{name}-{'-'.join(f'{k}{v}' for k, v in dims.items())}.db")
        print(f"== {name} {dims}: kiln tune --budget {args.budget} --db {db} --clock {args.clock}", flush=True)
        t0 = time.perf_counter()
        rep = tune_model(model, db, budget, dims=dims, clock=args.clock)
        row = {"model": name, "dims": dims, "db": db, "tune_s": time.perf_counter() - t0,
               "trials": sum(s.trials for s in rep.tasks), "estimated": rep.estimated_speedup,
               "end_to_end": rep.end_to_end}
        if args.peers:
            row["corpus_untuned"] = corpus_row(name, dims, None, args.work)
            row["corpus_tuned"] = corpus_row(name, dims, db, args.work)
        results.append(row)
        print(json.dumps({k: v for k, v in row.items() if not k.startswith("corpus")}, default=str), flush=True)
    with open(os.path.join(args.work, "summary.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)
    print(f"\nkiln tune --budget {args.budget} --clock {args.clock}, load {os.getloadavg()[0]:.1f}")
    print("| model | shape | tuning s | trials | est. | untuned ms | tuned ms | gain | kiln/best peer untuned | tuned |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        e = r["end_to_end"] or {}

        def ratio(row):
            v = row and row.get("ratio")
            return f"{v:.2f}" if isinstance(v, (int, float)) else "-"
        print(f"| {r['model']} | {','.join(f'{k}={v}' for k, v in r['dims'].items())} | {r['tune_s']:.0f} | "
              f"{r['trials']} | x{r['estimated']:.2f} | {e.get('untuned', 0) * 1e3:.3f} | {e.get('tuned', 0) * 1e3:.3f} | "
              f"x{e.get('speedup', 0):.2f}{'' if e.get('outputs_match', True) else ' (outputs DIFFER)'} | "
              f"{ratio(r.get('corpus_untuned'))} | {ratio(r.get('corpus_tuned'))} |")


if __name__ == "__main__":
    main()
