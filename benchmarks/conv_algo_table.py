"""A model's conv layers: the algorithm kiln runs each by, its GFLOP/s and fraction of the FMA peak.

    python benchmarks/conv_algo_table.py --model resnet50 --clock cpu --peak 116
    python benchmarks/conv_algo_table.py --convs resnet18|unet256|dbnet320|probe   # Winograd vs direct

`--model` (a path or a corpus name, its .onnx in ~/.cache/kiln-corpus): every distinct 2-D
dense conv (BatchNorm folded), with the algorithm the model runs it by at default options and
batch 1 (kiln.lower.conv_algo's choice after the layout pass's neighbour rule: winograd,
direct-nchwc or direct-nchw), timed alone as Conv+ReLU by that algorithm beside ONNX Runtime
(and, for a Winograd conv, the direct kernel it replaced), each checked against ORT.
`--convs` names a list of square 3x3 stride-1 shapes and times every algorithm on each (the
figures the chooser's rule was set from). GFLOP/s count direct convolution (2 OC C KH KW OH OW),
so Winograd can pass 100% of the FMA peak. `--peak`: the FMA peak of the threads used, in
GFLOP/s (default: threads x lanes x 2 pipes x 2 x the clock /proc/cpuinfo reports; Zen 4 runs
AVX-512 FMAs as two 256-bit halves: give half of that). `--clock cpu`: every engine on one
thread, timed by the calling thread's CPU time (robust to a loaded machine); else wall time,
interleaved (kiln.bench.time_interleaved), p10 reported beside the median. In wall mode on 2
threads (quiet, 2026-11-26) about half of ResNet-50's kiln rows ran at one thread's speed, likely
kiln's pool running a ~1 ms conv's loops alone after judging the cores contended (ORT's threads
spin after its runs): the 2-thread per-conv figures are not trustworthy yet; --clock cpu is.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import kiln  # noqa: E402
from benchmarks.conv_bench import blocked_graph, onnx_conv, timed  # noqa: E402
from kiln.bench import ort_session  # noqa: E402
from kiln.lower.conv_algo import ConvShape, choose  # noqa: E402
from kiln.ops.layout import from_blocked, pack_bias, to_blocked  # noqa: E402
from kiln.ops.winograd import transform_weight  # noqa: E402
from kiln.passes.layout import default_block  # noqa: E402
from kiln.passes.layout_rules import blockable_channels  # noqa: E402
from kiln.targets.target import Target  # noqa: E402

# name: (c, h, oc): 3x3 stride-1 pad-1 convs of square h x h inputs
CONVS = {
    "resnet18": {"l1": (64, 56, 64), "l2": (128, 28, 128), "l3": (256, 14, 256), "l4": (512, 7, 512)},
    "unet256": {"e1_32": (32, 256, 32), "e2_32to64": (32, 128, 64), "e2_64": (64, 128, 64),
                "e3_64to128": (64, 64, 128), "e3_128": (128, 64, 128), "e4_256": (256, 32, 256),
                "b_512": (512, 16, 512), "d4_512to256": (512, 32, 256), "d1_64to32": (64, 256, 32)},
    "dbnet320": {"l1_64": (64, 80, 64), "l3_256": (256, 20, 256), "l4_512": (512, 10, 512),
                 "fpn_80": (256, 80, 64), "fpn_20": (256, 20, 64), "fpn_10": (256, 10, 64)},
    "probe": {"c16_56": (16, 56, 16), "c24_56": (24, 56, 24), "c32_28": (32, 28, 32), "c512_7": (512, 7, 512),
              "c256_4": (256, 4, 256), "c64_8": (64, 8, 64), "c128_6": (128, 6, 128), "c256_13": (256, 13, 256)},
}


def winograd_graph(c, h, oc, p, w, b, block, m=4):
    """ConvWinograd F(m x m, 3x3) + fused ReLU alone, its weights transformed as the layout pass does."""
    from tests.passes.util import graph
    cb, ocb = -(-c // block), -(-oc // block)
    o = h + 2 * p - 2
    text = (f'graph "g" (%x: float32[1,{cb},{h},{h},{block}]) -> (%y)\n  opsets {{"": 17, "kiln": 1}}\n{{\n'
            f'  %y: float32[1,{ocb},{o},{o},{block}] = "kiln"::ConvWinograd(%x, %u, %b) {{m = {m}, '
            f'pads = [{p}, {p}, {p}, {p}], relu = 1}} name "conv"\n}}')
    return graph(text, u=transform_weight(w, block, m), b=pack_bias(b, oc, block, np.float32))


def _path(spec: str) -> str:
    return spec if os.path.exists(spec) else os.path.expanduser(f"~/.cache/kiln-corpus/{spec}.onnx")


def model_convs(spec: str) -> dict:
    """node name (x repeats) -> (c, h, oc, k, stride, pad, node name) of each distinct square 2-D
    dense conv with symmetric pads, BatchNorm folded."""
    from kiln.frontends.onnx import load_onnx
    from kiln.passes import run_passes
    g, _ = run_passes(load_onnx(_path(spec)), 2)
    first, counts = {}, {}
    for n in g.nodes:
        w = n.inputs[1].const if n.op == "Conv" and not n.domain and len(n.inputs) > 1 else None
        xs = n.inputs[0].type.shape if w is not None else None
        if w is None or w.ndim != 4 or int(n.attrs.get("group", 1)) != 1 or xs is None \
                or not all(isinstance(d, int) for d in xs[1:]) or xs[2] != xs[3] or w.shape[2] != w.shape[3]:
            continue
        pads, strides = [int(v) for v in n.attrs.get("pads", [0] * 4)], n.attrs.get("strides", [1, 1])
        if len(set(pads)) > 1 or len(set(strides)) > 1:
            continue
        key = (int(xs[1]), int(xs[2]), int(w.shape[0]), int(w.shape[2]), int(strides[0]), pads[0])
        counts[key] = counts.get(key, 0) + 1
        first.setdefault(key, n.name)
    return {f"{name}(x{counts[key]})": (*key, name) for key, name in first.items()}


def model_algorithms(spec: str) -> dict:
    """conv node name -> the algorithm the model runs it by at default options, its first case."""
    from kiln.compiler import frontend, optimize, specialize
    from kiln.passes.pipeline import DEFAULT_LEVEL
    path = _path(spec)
    side = path[:-5] + ".json"
    dims = json.load(open(side))["cases"][0] if os.path.exists(side) else {}
    from kiln.codegen.fork_cost import calibrated
    opt = optimize(frontend(path), DEFAULT_LEVEL, calibrated(Target.host()))   # (as kiln.compile's target)
    shapes = [tuple(dims.get(d, d) if isinstance(d, str) else d for d in v.type.shape) for v in opt.graph.inputs]
    kinds = {"ConvWinograd": "winograd", "ConvNCHWc": "direct-nchwc", "Conv": "direct-nchw"}
    spec = specialize(opt, shapes)
    why = {f.node: f.choice.reason for p in spec.stats for f in p.findings if hasattr(f, "choice")}
    return {n.name: (kinds[n.op], why.get(n.name, ""), int(n.attrs.get("m", 4))) for n in spec.graph.nodes
            if n.op in kinds}


def fma_peak_gflops(target: Target, threads: int) -> float | None:
    """One thread's FMA peak measured (benchmarks/fma_peak.py; a clock times two FMAs of the
    full width overstates a core that splits wide FMAs, Zen 4's 512-bit ones: 166 from the
    reported 2.6 GHz against 118 measured), times the threads."""
    from benchmarks.fma_peak import peak_gflops  # noqa: PLC0415
    return threads * peak_gflops(target.vector_lanes(4))


def engines(c, h, oc, k, s, p, block, want_algos, rng, m=4):
    """{engine: fn} for one conv (each checked against ORT; Winograd F(m x m, 3x3)), and its
    direct-conv FLOPs."""
    w = rng.standard_normal((oc, c, k, k)).astype(np.float32) / np.float32(np.sqrt(c * k * k))
    b = rng.standard_normal(oc).astype(np.float32)
    x = rng.standard_normal((1, c, h, h)).astype(np.float32)
    model, o = onnx_conv(c, (h, h), oc, k, s, p, w, b)
    flops = 2 * oc * c * k * k * int(np.prod(o))
    sess = ort_session(model, int(os.environ.get("OMP_NUM_THREADS", Target.host().cores)))
    want = sess.run(None, {"x": x})[0]
    fns = {"ort": lambda: sess.run(None, {"x": x})}
    if "direct-nchw" in want_algos:
        old = os.environ.get("KILN_NCHWC")
        os.environ["KILN_NCHWC"] = "0"
        try:
            m0 = kiln.compile(model)
        finally:
            os.environ.pop("KILN_NCHWC")
            if old is not None:
                os.environ["KILN_NCHWC"] = old
        np.testing.assert_allclose(m0.run(x=x)["y"], want, rtol=1e-3, atol=1e-3)
        fns["direct-nchw"] = lambda: m0.run(x=x)
    if "direct-nchwc" in want_algos:
        bg, ib = blocked_graph(c, (h, h), oc, k, s, p, w, b, block)
        mb = kiln.compile(bg)
        xb = to_blocked(x, ib)
        np.testing.assert_allclose(from_blocked(mb.run(x=xb)["y"], oc), want, rtol=1e-3, atol=1e-3)
        fns["direct-nchwc"] = lambda: mb.run(x=xb)
    if "winograd" in want_algos:
        mw = kiln.compile(winograd_graph(c, h, oc, p, w, b, block, m))
        xw = to_blocked(x, block)
        np.testing.assert_allclose(from_blocked(mw.run(x=xw)["y"], oc), want, rtol=1e-3,
                                   atol=1e-3 * np.abs(want).max())
        fns["winograd"] = lambda: mw.run(x=xw)
    return fns, flops


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="")
    ap.add_argument("--convs", default="")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--per-round", type=int, default=3)
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    ap.add_argument("--peak", type=float, default=None)
    args = ap.parse_args(argv)
    if args.clock == "cpu":
        os.environ["OMP_NUM_THREADS"] = "1"
    target = Target.host()
    threads = int(os.environ.get("OMP_NUM_THREADS", target.cores))
    peak = args.peak or fma_peak_gflops(target, threads)
    block = default_block(target)
    rng = np.random.default_rng(0)
    print(f"{target.name} {target.vector_bytes * 8}-bit vectors, block {block}, {threads} thread(s), clock "
          f"{args.clock}, FMA peak {peak or float('nan'):.0f} GFLOP/s{' (given)' if args.peak else ''}; "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    rows, reasons = [], {}
    if args.model:
        runs = model_algorithms(args.model)
        for label, (c, h, oc, k, s, p, node) in model_convs(args.model).items():
            algo, reason, m = runs.get(node, ("direct-nchw", "", 4))
            reasons[label] = reason
            # beside a 3x3 stride-1 conv's algorithm, the other the chooser weighed (blocked direct
            # for Winograd, Winograd for a blocked direct conv it turned down: kiln.lower.conv_algo)
            wino = k == 3 and s == 1
            alts = {algo} | ({"winograd", "direct-nchwc"} if wino and algo != "direct-nchw" else set())
            fns, flops = engines(c, h, oc, k, s, p, block, alts, rng, m)
            load = os.getloadavg()[0]
            st = timed(fns, args)
            rows.append((label, c, h, oc, k, s, algo, st[algo], flops, st, load))
    else:
        for label, (c, h, oc) in CONVS[args.convs].items():
            blockable = blockable_channels(c, oc, block, (3, 3))
            choice = choose(ConvShape(1, c, oc, (h, h), (3, 3), (1, 1), (1, 1), 1, blockable, block), target)
            fns, flops = engines(c, h, oc, 3, 1, 1, block, {"direct-nchw", "direct-nchwc", "winograd"}
                                 if blockable else {"direct-nchw"}, rng)
            load = os.getloadavg()[0]
            st = timed(fns, args)
            rows.append((label, c, h, oc, 3, 1, choice.algorithm, st[choice.algorithm], flops, st, load))
    print("\n| conv | C->OC | in | k/s | algorithm | ms median | ms p10 | GFLOP/s (p10) | of FMA peak | "
          "ORT ms p10 | others, ms p10 | load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for label, c, h, oc, k, s, algo, mine, flops, st, load in rows:
        gf = flops / mine["p10_ms"] / 1e6
        others = ", ".join(f"{k2} {v['p10_ms']:.3f}" for k2, v in st.items() if k2 not in (algo, "ort"))
        print(f"| {label} | {c}->{oc} | {h}x{h} | {k}x{k}/{s} | {algo} | {mine['median_ms']:.3f} | "
              f"{mine['p10_ms']:.3f} | {gf:.0f} | {gf / peak if peak else float('nan'):.0%} | "
              f"{st['ort']['p10_ms']:.3f} | {others or '-'} | {load:.1f} |", flush=True)
    if args.model:      # the model's convs in all, each distinct conv times its repeats
        reps = [int(label.rsplit("(x", 1)[1][:-1]) for label, *_ in rows]
        ms = sum(r * mine["p10_ms"] for r, (_, _, _, _, _, _, _, mine, *_) in zip(reps, rows))
        ort = sum(r * st["ort"]["p10_ms"] for r, (*_, st, _) in zip(reps, rows))
        flops = sum(r * row[8] for r, row in zip(reps, rows))
        print(f"\nall {sum(reps)} convs: kiln {ms:.2f} ms p10 ({flops / ms / 1e6:.0f} GFLOP/s, "
              f"{flops / ms / 1e6 / peak if peak else float('nan'):.0%} of peak), ORT {ort:.2f} ms p10; "
              f"{flops / 1e9:.2f} GFLOP counted as direct convolution")
        if threads < target.cores:
            print(f"(the algorithms are chosen for the target's {target.cores} cores; timed here on {threads})")
        print("\nwhy (kiln.lower.conv_algo's reason, as model.report lists it):")
        for label, why in reasons.items():
            print(f"- {label}: {why or '?'}")


if __name__ == "__main__":
    main()
