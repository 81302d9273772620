"""Benchmark kiln against ONNX Runtime (and PyTorch) on the models in benchmarks/models.py.

    python benchmarks/run.py [--models mlp,resnet18] [--target interpreter|cpu]
                             [--against ort,torch] [--threads N] [--runs N] [--ort-runs N]
                             [--opt-levels 0,3] [--json results.json]

Per model (and opt level): compile time cold and warm (a second compile of the same
model), kiln's outputs checked against ORT on fresh seeded inputs, then kiln, ORT and
(with --against torch, the default when torch is installed) eager PyTorch running the
same graph (kiln.peers.torch_graph, itself checked against ORT) timed interleaved in
this one process — alternating rounds, so drift in clocks or load hits all alike —
reporting median, p10, p90 and the ratios kiln/ORT and kiln/torch. A model kiln
cannot compile still gets its peers' timings, with the error in its row.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kiln  # noqa: E402
from benchmarks.models import MODELS, inputs_for  # noqa: E402
from kiln.bench import compare, ort_session, stats, time_interleaved  # noqa: E402

RTOL, ATOL = 1e-3, 1e-4
DEFAULT_RUNS = {"interpreter": 3, "cpu": 50}


def bench(name: str, model, args, opt_level) -> dict:
    """One row: compile, check against ORT, time kiln and the peers interleaved."""
    row = {"model": name, "target": args.target, "opt_level": opt_level, "error": None}
    feeds = inputs_for(name, model, seed=args.seed)
    t = time.perf_counter()
    sess = ort_session(model, args.threads)
    row["ort_load_s"] = time.perf_counter() - t
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    fns, runs = {"ort": lambda: sess.run(None, feeds)}, {"ort": args.ort_runs}
    if "torch" in args.against:
        add_torch_peer(row, model, feeds, want, args, fns, runs)
    options = {"tier": "full"} if opt_level is None else {"opt_level": opt_level, "tier": "full"}   # -O3 timed
    try:
        for key in ("compile_cold_s", "compile_warm_s"):
            t = time.perf_counter()
            compiled = kiln.compile(model, target=args.target, **options)
            row[key] = time.perf_counter() - t
        row.update(compare(compiled.run(feeds), want, RTOL, ATOL))  # also kiln's warm-up run
        fns["kiln"], runs["kiln"] = (lambda: compiled.run(feeds)), args.runs
    except Exception as e:  # KilnError expected; anything else is a kiln bug, reported alike
        row["error"] = f"{type(e).__name__}: {e}"
    times = time_interleaved(fns, runs, rounds=max(1, min(10, args.runs)))
    for k, ms in times.items():
        row[k] = stats(ms)
    if "kiln" in row:
        row["ratio"] = row["kiln"]["median_ms"] / row["ort"]["median_ms"]
        if "torch" in row:
            row["ratio_torch"] = row["kiln"]["median_ms"] / row["torch"]["median_ms"]
    return row


def add_torch_peer(row: dict, model, feeds: dict, want: dict, args, fns: dict, runs: dict) -> None:
    """Eager PyTorch on the same graph: its load time, its error against ORT, a timed fn."""
    from kiln.peers.torch_graph import TorchGraph
    try:
        t = time.perf_counter()
        peer = TorchGraph(model, args.threads)
        row["torch_load_s"] = time.perf_counter() - t
        row["torch_vs_ort"] = compare(peer(feeds), want, RTOL, ATOL)
    except Exception as e:  # KilnError (an op it lacks) or torch's own: reported, not fatal
        row["torch_error"] = f"{type(e).__name__}: {e}"
        return
    fns["torch"], runs["torch"] = (lambda: peer(feeds)), args.ort_runs


def fmt_time(s: dict | None) -> str:
    return "-" if s is None else f"{s['median_ms']:.2f} ({s['p10_ms']:.2f}-{s['p90_ms']:.2f})"


def table(rows: list[dict]) -> str:
    """Plain-text table, one line per row, errors listed underneath."""
    torch = any("torch" in r or "torch_error" in r for r in rows)
    head = ["model", "opt", "compile cold/warm s", "ort load s", "max abs", "max rel", "ok",
            "kiln ms med (p10-p90)", "ort ms med (p10-p90)", "kiln/ort"]
    head += ["torch ms med (p10-p90)", "kiln/torch", "torch ok"] if torch else []
    lines = []
    for r in rows:
        compiled = "compile_cold_s" in r
        extra = [fmt_time(r.get("torch")), f"{r['ratio_torch']:.2f}" if "ratio_torch" in r else "-",
                 ("yes" if r["torch_vs_ort"]["ok"] else "NO") if "torch_vs_ort" in r else "ERR"] if torch else []
        lines.append([
            r["model"], "-" if r["opt_level"] is None else str(r["opt_level"]),
            f"{r['compile_cold_s']:.2f}/{r['compile_warm_s']:.2f}" if compiled else "-",
            f"{r['ort_load_s']:.2f}",
            f"{r['max_abs']:.2e}" if "max_abs" in r else "-",
            f"{r['max_rel']:.2e}" if "max_rel" in r else "-",
            ("yes" if r["ok"] else "NO") if "ok" in r else "ERR",
            fmt_time(r.get("kiln")), fmt_time(r.get("ort")),
            f"{r['ratio']:.2f}" if "ratio" in r else "-", *extra])
    widths = [max(len(c) for c in col) for col in zip(head, *lines)]
    out = ["  ".join(c.ljust(w) for c, w in zip(line, widths)) for line in [head, *lines]]
    out.insert(1, "  ".join("-" * w for w in widths))
    out += [f"{r['model']} opt={r['opt_level']}: {r['error']}" for r in rows if r["error"]]
    out += [f"{r['model']} opt={r['opt_level']}: torch: {r['torch_error']}" for r in rows if "torch_error" in r]
    return "\n".join(out)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS),
                   help=f"comma-separated subset of {', '.join(MODELS)}")
    p.add_argument("--target", default="interpreter", choices=["interpreter", "cpu"])
    p.add_argument("--against", default="ort,torch" if importlib.util.find_spec("torch") else "ort",
                   help="peers to time beside kiln: ort (always: it is the reference), torch "
                        "(default when torch is installed)")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="ORT and torch intra-op threads")
    p.add_argument("--runs", type=int, help="timed kiln runs (default: 3 interpreter, 50 cpu)")
    p.add_argument("--ort-runs", type=int, default=50, help="timed ORT runs")
    p.add_argument("--opt-levels", default=None,
                   help="comma-separated kiln opt levels, one row each (default: kiln's default)")
    p.add_argument("--seed", type=int, default=1, help="seed of the random inputs")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON")
    args = p.parse_args(argv)
    unknown = set(args.models.split(",")) - set(MODELS)
    if unknown:
        p.error(f"unknown model(s) {sorted(unknown)}; choose from {list(MODELS)}")
    args.against = [a.strip() for a in args.against.split(",") if a.strip()]
    if set(args.against) - {"ort", "torch"}:
        p.error(f"unknown peer(s) {sorted(set(args.against) - {'ort', 'torch'})}; choose from ort, torch")
    args.runs = args.runs or DEFAULT_RUNS[args.target]
    return args


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    levels = [None] if args.opt_levels is None else [int(v) for v in args.opt_levels.split(",")]
    rows = []
    for name in args.models.split(","):
        model = MODELS[name]()
        for level in levels:
            rows.append(bench(name, model, args, level))
            print(f"done {name} opt={level}", file=sys.stderr, flush=True)
    print(f"target={args.target}  peers={','.join(args.against)}  peer threads={args.threads}  "
          f"kiln runs={args.runs}  peer runs={args.ort_runs}  rtol={RTOL} atol={ATOL}")
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=2)
    return rows


if __name__ == "__main__":
    main()
