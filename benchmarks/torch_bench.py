"""kiln as a torch.compile backend against eager torch and Inductor, on torch-defined models.

    python benchmarks/torch_bench.py [--threads 2] [--runs 30] [--models resnet,gpt,...]

Per model: compile time (the first call of each torch.compile'd module, which
traces and compiles; kiln on an empty build cache) and median latency of later
calls, the engines interleaved in rounds (kiln.bench.time_interleaved) under
torch.inference_mode with `--threads` threads for every engine. The models are
torch versions of benchmarks/models.py's shapes (ResNet-18, MobileNetV2, an MLP,
a BERT encoder, a GPT-2 decoder) and three small decoder/encoder variants.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kiln.bench import fresh_cache, stats, time_interleaved  # noqa: E402
from kiln.frontends.torch_dynamo import register  # noqa: E402
from tests.frontends.torch import zoo  # noqa: E402


def models():
    ids = lambda v, b, t: torch.randint(0, v, (b, t), generator=torch.Generator().manual_seed(0))  # noqa: E731
    return {
        "mlp": lambda: (torch.nn.Sequential(torch.nn.Linear(784, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048),
                                            torch.nn.ReLU(), torch.nn.Linear(2048, 10)), (torch.randn(64, 784),)),
        "resnet": lambda: (zoo.ResNet(widths=(64, 128, 256, 512), classes=1000), (torch.randn(1, 3, 224, 224),)),
        "mobilenet_v2": lambda: (zoo.MobileNetV2(classes=1000), (torch.randn(1, 3, 224, 224),)),
        "bert": lambda: (zoo.BertLike(vocab=30522, d=384, heads=12, layers=6, ctx=512),
                         (ids(30522, 1, 128), torch.ones(1, 128, dtype=torch.int64))),
        "gpt": lambda: (zoo.GPT(vocab=50257, d=512, layers=4, ctx=1024), (ids(50257, 1, 128),)),
        "llama": lambda: (zoo.Llama(vocab=32000, d=512, layers=4, heads=8, kv_heads=2), (ids(32000, 1, 128),)),
        "encoder_layer": lambda: (torch.nn.TransformerEncoder(
            torch.nn.TransformerEncoderLayer(512, 8, 2048, dropout=0.0, batch_first=True), 4,
            enable_nested_tensor=False), (torch.randn(1, 128, 512),)),
        "lstm_tagger": lambda: (zoo.LSTMTagger(vocab=10000, emb=128, hidden=256, tags=20), (ids(10000, 4, 32),)),
    }


def first_call(fn, inputs):
    t = time.perf_counter()
    with torch.inference_mode():
        out = fn(*inputs)
    return out, time.perf_counter() - t


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--models", default=",".join(models()))
    ap.add_argument("--no-inductor", action="store_true")
    args = ap.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    torch.set_num_threads(args.threads)
    torch._dynamo.config.allow_rnn = True
    register()
    rows = []
    for name in args.models.split(","):
        torch.manual_seed(0)
        m, inputs = models()[name]()
        m.eval()
        torch._dynamo.reset()
        engines, compile_s, errs = {"eager": m}, {}, {}
        with torch.inference_mode():
            want = m(*inputs)
        with fresh_cache():
            k = torch.compile(m, backend="kiln")
            got, compile_s["kiln"] = first_call(k, inputs)
        engines["kiln"] = k
        errs["kiln"] = float((got - want).abs().max()) if isinstance(want, torch.Tensor) else float("nan")
        if not args.no_inductor:
            try:
                ind = torch.compile(m)
                got, compile_s["inductor"] = first_call(ind, inputs)
                engines["inductor"] = ind
            except Exception as e:  # no C++ toolchain for Inductor, ...
                print(f"{name}: inductor skipped: {type(e).__name__}: {str(e)[:200]}")
        fns = {e: (lambda f: lambda: first_call(f, inputs))(f) for e, f in engines.items()}
        times = {e: stats(v)["median_ms"] for e, v in
                 time_interleaved(fns, {e: args.runs for e in fns}, rounds=min(10, args.runs)).items()}
        rows.append((name, times, compile_s, errs["kiln"]))
        print(f"{name}: " + ", ".join(f"{e} {t:.2f} ms" for e, t in times.items())
              + " | compile " + ", ".join(f"{e} {s:.1f} s" for e, s in compile_s.items())
              + f" | kiln max abs err {errs['kiln']:.1e}", flush=True)
    print(f"\n| model | eager ms | kiln ms | inductor ms | kiln compile s | inductor compile s |   ({args.threads} threads)")
    print("|---|---|---|---|---|---|")
    for name, t, c, _ in rows:
        print(f"| {name} | {t['eager']:.2f} | {t['kiln']:.2f} | {t.get('inductor', float('nan')):.2f} | "
              f"{c['kiln']:.1f} | {c.get('inductor', float('nan')):.1f} |")


if __name__ == "__main__":
    main()
