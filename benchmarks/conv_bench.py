"""Per-conv microbenchmark: kiln -O3's NCHW conv kernel (layout pass off), kiln's blocked
ConvNCHWc kernel (its input already blocked, so no conversions are timed) and ONNX Runtime on
the same Conv+Relu, interleaved in one process on the same seeded input; prints the median and
p10 ms and GFLOP/s of each, after checking both kiln kernels against ORT.

    python benchmarks/conv_bench.py --convs resnet18 --rounds 15 --per-round 5 [--only l1_3x3,l4_3x3]
    python benchmarks/conv_bench.py --convs depthwise      # MobileNet/EfficientNet depthwise convs

The timings include each engine's per-call overhead (tens of microseconds); OMP_NUM_THREADS
sets kiln's threads, --threads ORT's.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import kiln  # noqa: E402
from kiln.bench import ort_session, stats, time_interleaved  # noqa: E402
from kiln.ops.layout import from_blocked, pack_bias, pack_conv_weight, to_blocked  # noqa: E402
from kiln.passes.layout import default_block  # noqa: E402
from kiln.targets.target import Target  # noqa: E402

# name: (c, h, oc, k, stride, pad[, depthwise])
CONVS = {
    "resnet18": {
        "stem7x7s2": (3, 224, 64, 7, 2, 3),
        "l1_3x3": (64, 56, 64, 3, 1, 1),
        "l2_3x3s2": (64, 56, 128, 3, 2, 1),
        "l2_3x3": (128, 28, 128, 3, 1, 1),
        "l2_ds1x1s2": (64, 56, 128, 1, 2, 0),
        "l3_3x3s2": (128, 28, 256, 3, 2, 1),
        "l3_3x3": (256, 14, 256, 3, 1, 1),
        "l3_ds1x1s2": (128, 28, 256, 1, 2, 0),
        "l4_3x3s2": (256, 14, 512, 3, 2, 1),
        "l4_3x3": (512, 7, 512, 3, 1, 1),
        "l4_ds1x1s2": (256, 14, 512, 1, 2, 0),
    },
    # the depthwise convs of inverted residuals (MobileNetV2/V3, EfficientNet-B0 at 224)
    "depthwise": {
        "dw3x3_32x112": (32, 112, 32, 3, 1, 1, True),
        "dw3x3s2_96x112": (96, 112, 96, 3, 2, 1, True),
        "dw3x3_144x56": (144, 56, 144, 3, 1, 1, True),
        "dw5x5s2_144x56": (144, 56, 144, 5, 2, 2, True),
        "dw5x5_240x28": (240, 28, 240, 5, 1, 2, True),
        "dw3x3_480x14": (480, 14, 480, 3, 1, 1, True),
        "dw5x5_672x14": (672, 14, 672, 5, 1, 2, True),
        "dw5x5s2_672x14": (672, 14, 672, 5, 2, 2, True),
        "dw3x3_960x7": (960, 7, 960, 3, 1, 1, True),
    },
}


def onnx_conv(c, h, oc, k, s, p, w, b, dw=False):
    o = (h + 2 * p - k) // s + 1
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[k, k], strides=[s, s], pads=[p] * 4,
                              group=c if dw else 1),
             helper.make_node("Relu", ["c"], ["y"])]
    g = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, h])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, oc, o, o])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), o


def blocked_graph(c, h, oc, k, s, p, w, b, block, dw=False):
    from tests.passes.util import graph
    cb, ocb = -(-c // block), -(-oc // block)
    o = (h + 2 * p - k) // s + 1
    text = (f'graph "g" (%x: float32[1,{cb},{h},{h},{block}]) -> (%y)\n  opsets {{"": 17, "kiln": 1}}\n{{\n'
            f'  %c: float32[1,{ocb},{o},{o},{block}] = "kiln"::ConvNCHWc(%x, %w, %b) {{kernel_shape = [{k}, {k}], '
            f'strides = [{s}, {s}], pads = [{p}, {p}, {p}, {p}], dilations = [1, 1], depthwise = {int(dw)}}} name "conv"\n'
            f'  %y: float32[1,{ocb},{o},{o},{block}] = Relu(%c) name "relu"\n}}')
    return graph(text, w=pack_conv_weight(w, block, dw), b=pack_bias(b, oc, block, np.float32))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--convs", default="resnet18")
    ap.add_argument("--only", default="")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--per-round", type=int, default=5)
    ap.add_argument("--no-nchw", action="store_true")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="ORT intra-op threads")
    args = ap.parse_args(argv)
    block = default_block(Target.host())
    rng = np.random.default_rng(0)
    for name, (c, h, oc, k, s, p, *dw) in CONVS[args.convs].items():
        if args.only and name not in args.only.split(","):
            continue
        dw = bool(dw and dw[0])
        cg = 1 if dw else c
        w = rng.standard_normal((oc, cg, k, k)).astype(np.float32) / np.float32(np.sqrt(cg * k * k))
        b = rng.standard_normal(oc).astype(np.float32)
        x = rng.standard_normal((1, c, h, h)).astype(np.float32)
        model, o = onnx_conv(c, h, oc, k, s, p, w, b, dw)
        flops = 2 * oc * cg * k * k * o * o
        sess = ort_session(model, args.threads)
        want = sess.run(None, {"x": x})[0]
        fns = {"ort": lambda: sess.run(None, {"x": x})}
        if not args.no_nchw:
            old = os.environ.get("KILN_NCHWC")
            os.environ["KILN_NCHWC"] = "0"
            try:
                m0 = kiln.compile(model, target="cpu", opt_level=3)
            finally:
                os.environ.pop("KILN_NCHWC")
                if old is not None:
                    os.environ["KILN_NCHWC"] = old
            got = m0.run({"x": x})
            got = got["y"] if isinstance(got, dict) else got[0]
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)
            fns["nchw"] = lambda: m0.run({"x": x})
        mb = kiln.compile(blocked_graph(c, h, oc, k, s, p, w, b, block, dw), target="cpu", opt_level=3)
        xb = to_blocked(x, block)
        got = mb.run({"x": xb})
        got = got["y"] if isinstance(got, dict) else got[0]
        np.testing.assert_allclose(from_blocked(got, oc), want, rtol=1e-3, atol=1e-3)
        fns["nchwc"] = lambda: mb.run({"x": xb})
        for f in fns.values():
            f()
        t = time_interleaved(fns, {kk: args.rounds * args.per_round for kk in fns}, args.rounds)
        st = {kk: stats(v) for kk, v in t.items()}
        print(f"{name:12s} {flops / 1e9:.3f} GF | " + " | ".join(
            f"{kk} {v['median_ms']:.3f} ms (p10 {v['p10_ms']:.3f}) {flops / v['median_ms'] / 1e6:.0f} GF/s"
            for kk, v in st.items()), flush=True)


if __name__ == "__main__":
    main()
