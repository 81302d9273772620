"""kiln as a torch.compile backend against eager torch, Inductor and OpenVINO, on torch models.

    python benchmarks/torch_bench.py [--threads 2] [--runs 30] [--models mlp,resnet18,...]
                                     [--engines eager,kiln,inductor,openvino] [--json out.json]

The models: benchmarks/models.py's five at their shapes, written in torch (mlp batch 64,
resnet18 and mobilenetv2 batch 1 at 224x224, a MiniLM-shaped BERT encoder and a GPT-2-style
decoder at batch 1, seq 128), and three corpus transformers (benchmarks/corpus/transformer.py:
bert_base, gpt2, llama_gqa) at --corpus-shape. Every engine runs the same module under
torch.inference_mode with --threads threads: "kiln" is torch.compile(backend="kiln"),
"inductor" torch.compile's default, "openvino" torch.compile(backend="openvino") where
openvino is installed (else its column says why not), in f32 (no bf16 precision hint).

Compile time is each engine's first call (Dynamo's trace plus the backend's compile; kiln
on an empty build cache, Inductor with a fresh cache directory and its FX graph cache off).
Latency: per engine the median of --runs later calls, the engines interleaved in rounds
(kiln.bench.time_interleaved), so drift in load or clocks hits them alike. Each engine's
outputs are checked against eager's (rtol 1e-3, atol 1e-4); a mismatch is marked in the table.
Timings on a loaded machine are noise: check `uptime` first.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("KILN_TIER", "full")   # time the -O3 build, never a quick tier (kiln.codegen.tiers)

from kiln.bench import fresh_cache, stats, time_interleaved  # noqa: E402
from kiln.bench_torch import torch_peer  # noqa: E402
from kiln.dynamo import register  # noqa: E402

ENGINES = ("eager", "kiln", "inductor", "openvino")
CORPUS = ("bert_base", "gpt2", "llama_gqa")
RTOL, ATOL = 1e-3, 1e-4


def _ids(vocab, b, t):
    return torch.randint(0, vocab, (b, t), generator=torch.Generator().manual_seed(0))


def _randn(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


def benchmark_models():
    """benchmarks/models.py's five models, in torch, at that file's shapes and widths."""
    from torch import nn
    from benchmarks.corpus import cnn
    from tests.frontends.torch import zoo
    return {
        "mlp": lambda: (nn.Sequential(nn.Linear(784, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(),
                                      nn.Linear(2048, 10)), (_randn(64, 784),)),
        "resnet18": lambda: (zoo.ResNet(widths=(64, 128, 256, 512), classes=1000), (_randn(1, 3, 224, 224),)),
        "mobilenetv2": lambda: (cnn.mobilenet_v2(classes=1000), (_randn(1, 3, 224, 224),)),
        "bert_encoder": lambda: (zoo.BertLike(vocab=30522, d=384, heads=12, layers=6, ctx=512, ff=4),
                                 (_ids(30522, 1, 128), torch.ones(1, 128, dtype=torch.int64))),
        "gpt2_decoder": lambda: (zoo.GPT(vocab=8192, d=512, layers=4, ctx=1024, heads=8), (_ids(8192, 1, 128),)),
    }


def corpus_models(shape: dict):
    """The corpus transformers in CORPUS at `shape` (their inputs' symbols bound)."""
    from benchmarks.corpus import specs
    from benchmarks.corpus.spec import concrete
    out = {}
    for spec in specs():
        if spec.name not in CORPUS:
            continue

        def make(spec=spec):
            g = torch.Generator().manual_seed(0)
            xs = []
            for i in spec.inputs:
                dims = concrete(i.shape, shape)
                xs.append(torch.randn(dims, generator=g) if i.dtype == "float32" else
                          torch.randint(i.low, max(i.high, i.low + 1), dims, generator=g,
                                        dtype=getattr(torch, i.dtype)))
            return spec.make(), tuple(xs)
        out[spec.name] = make
    return out


def call(fn, inputs):
    with torch.inference_mode():
        return fn(*inputs)


def max_error(got, want) -> tuple[float, bool]:
    """(largest absolute difference, every output within rtol/atol) over the output leaves."""
    g, w = torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)
    if len(g) != len(w):
        return float("nan"), False
    err, ok = 0.0, True
    for a, b in zip(g, w):
        if a.shape != b.shape:
            return float("nan"), False
        a, b = a.double(), b.double()
        err = max(err, float((a - b).abs().max()) if a.numel() else 0.0)
        ok = ok and bool(torch.allclose(a, b, rtol=RTOL, atol=ATOL))
    return err, ok


def bench_model(name, make, engines, args) -> dict:
    torch.manual_seed(0)
    model, inputs = make()
    model.eval()
    torch._dynamo.reset()
    row = {"model": name, "ms": {}, "p10_ms": {}, "p90_ms": {}, "compile_s": {}, "max_err": {}, "ok": {},
           "skipped": {}}
    want = call(model, inputs)
    fns = {}
    for e in engines:
        try:
            fn = torch_peer(e, model, args.threads)
            t = time.perf_counter()
            if e == "kiln":
                with fresh_cache():
                    got = call(fn, inputs)
            else:
                got = call(fn, inputs)
            if e != "eager":
                row["compile_s"][e] = time.perf_counter() - t
                row["max_err"][e], row["ok"][e] = max_error(got, want)
            fns[e] = (lambda f: lambda: call(f, inputs))(fn)
        except Exception as ex:  # an engine that cannot run this model: reported in its row
            row["skipped"][e] = f"{type(ex).__name__}: {str(ex).strip().splitlines()[0][:300] if str(ex).strip() else ''}"
            print(f"{name}: {e} skipped: {row['skipped'][e]}", flush=True)
    times = time_interleaved(fns, {e: args.runs for e in fns}, rounds=max(1, min(10, args.runs)))
    for e, ms in times.items():
        s = stats(ms)
        row["ms"][e], row["p10_ms"][e], row["p90_ms"][e] = s["median_ms"], s["p10_ms"], s["p90_ms"]
    print(f"{name}: " + ", ".join(f"{e} {t:.2f} ms" for e, t in row["ms"].items())
          + " | compile " + ", ".join(f"{e} {s:.1f} s" for e, s in row["compile_s"].items())
          + " | max abs err " + ", ".join(f"{e} {v:.1e}" for e, v in row["max_err"].items()), flush=True)
    return row


def table(rows: list[dict], engines, threads: int, load: str) -> str:
    peers = [e for e in engines if e != "eager"]
    head = (["model"] + [f"{e} ms" for e in engines] + [f"kiln/{e}" for e in engines if e != "kiln"]
            + [f"{e} compile s" for e in peers])
    lines = [f"torch models, {threads} threads, median of interleaved runs; load average at start: {load}",
             "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def ms(r, e):
        if e in r["skipped"]:
            return "skipped"
        if e not in r["ms"]:
            return "-"
        return f"{r['ms'][e]:.2f}" + ("" if r["ok"].get(e, True) else " (mismatch)")

    for r in rows:
        k = r["ms"].get("kiln")
        ratios = [f"{k / r['ms'][e]:.2f}" if k and r["ms"].get(e) else "-" for e in engines if e != "kiln"]
        comp = [f"{r['compile_s'][e]:.1f}" if e in r["compile_s"] else "-" for e in peers]
        lines.append("| " + " | ".join([r["model"]] + [ms(r, e) for e in engines] + ratios + comp) + " |")
    skipped = {(e, why) for r in rows for e, why in r["skipped"].items()}
    lines += [f"\n{e} skipped: {why}" for e, why in sorted(skipped)]
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--models", default=",".join(list(benchmark_models()) + list(CORPUS)))
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--corpus-shape", default="batch=1,seq=128",
                    help="the corpus transformers' symbol bindings (default: batch=1,seq=128)")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args(argv)
    engines = [e.strip() for e in args.engines.split(",")]
    if set(engines) - set(ENGINES) or "kiln" not in engines:
        ap.error(f"--engines: choose from {list(ENGINES)}, kiln included")
    shape = {k: int(v) for k, v in (kv.split("=") for kv in args.corpus_shape.split(","))}
    makers = {**benchmark_models(), **corpus_models(shape)}
    names = [n.strip() for n in args.models.split(",")]
    if set(names) - set(makers):
        ap.error(f"unknown model(s) {sorted(set(names) - set(makers))}; choose from {list(makers)}")

    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    torch.set_num_threads(args.threads)
    torch._dynamo.config.cache_size_limit = max(64, torch._dynamo.config.cache_size_limit)
    import torch._inductor.config as inductor_config
    inductor_config.fx_graph_cache = False
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="kiln-bench-inductor-")
    register()
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    rows = []
    for n in names:
        rows.append(bench_model(n, makers[n], engines, args))
        if args.json:  # after every model: an interrupted run keeps the rows it measured
            with open(args.json, "w") as f:
                json.dump({"threads": args.threads, "runs": args.runs, "load_at_start": load, "rows": rows},
                          f, indent=1)
    print("\n" + table(rows, engines, args.threads, load))
    return rows


if __name__ == "__main__":
    main()
