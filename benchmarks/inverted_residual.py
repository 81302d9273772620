"""Fused inverted residual blocks against their three convs, one thread, thread CPU time.

Each block (expand 1x1 + act, depthwise KxK + act, project 1x1 [+ residual]) is compiled as a
one-block model twice, with `conv.inverted_residual` fused and unfused; both are checked
against each other, then their kernels are timed interleaved (`CompiledModel.profile`, the
layout conversions at the model's edges left out) and the medians printed with GFLOP/s:

    python benchmarks/inverted_residual.py [--blocks mobilenet_v2|mobilenet_v3|efficientnet_b0] [--rounds 5]

The shapes are those of MobileNetV2, V3-Large and EfficientNet-B0 at 224x224 (batch 1).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("KILN_TIER", "full")   # time the -O3 build, never a quick tier (kiln.codegen.tiers)

import numpy as np  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import kiln  # noqa: E402

# (in channels, expanded, out channels, input size, kernel, stride, activation)
BLOCKS = {
    "mobilenet_v2": [(16, 96, 24, 112, 3, 2, "Clip"), (24, 144, 24, 56, 3, 1, "Clip"),
                     (24, 144, 32, 56, 3, 2, "Clip"), (32, 192, 32, 28, 3, 1, "Clip"),
                     (32, 192, 64, 28, 3, 2, "Clip"), (64, 384, 64, 14, 3, 1, "Clip"),
                     (64, 384, 96, 14, 3, 1, "Clip"), (96, 576, 96, 14, 3, 1, "Clip"),
                     (96, 576, 160, 14, 3, 2, "Clip"), (160, 960, 160, 7, 3, 1, "Clip"),
                     (160, 960, 320, 7, 3, 1, "Clip")],
    "mobilenet_v3": [(16, 64, 24, 112, 3, 2, "Relu"), (24, 72, 24, 56, 3, 1, "Relu"),
                     (40, 240, 80, 28, 3, 2, "HardSwish"), (80, 200, 80, 14, 3, 1, "HardSwish"),
                     (80, 184, 80, 14, 3, 1, "HardSwish")],
    # EfficientNet-B0's first MBConv blocks, Swish (SiLU) after expand and depthwise, without
    # their squeeze-excite gates (which keep the project conv out: kiln::ExpandDepthwise)
    "efficientnet_b0": [(16, 96, 24, 112, 3, 2, "SiLU"), (24, 144, 24, 56, 3, 1, "SiLU"),
                        (24, 144, 40, 56, 5, 2, "SiLU"), (40, 240, 40, 28, 5, 1, "SiLU")],
}


def block_model(c, e, o, h, k, s, act, seed=0, *, n=1, w=None, acts=None, residual=None,
                batch_dim=False) -> bytes:
    """An ONNX model of one block: expand 1x1 -> act -> depthwise kxk stride s -> act -> project
    1x1 -> act [-> + x]. `acts`: the three activations ("Relu", "Clip", "HardSwish", "SiLU" as
    x * Sigmoid(x), or "" for none; default: `act`, `act`, ""); `residual` (default: when the
    shapes allow it) adds the input; `batch_dim`: the batch dim symbolic."""
    rng = np.random.default_rng(seed)
    w = h if w is None else w
    acts = (act, act, "") if acts is None else acts
    residual = (s == 1 and c == o) if residual is None else residual
    inits, nodes = [], []

    def const(name, a):
        inits.append(numpy_helper.from_array(np.asarray(a, np.float32), name))
        return name

    def conv(x, wt, b, out, group=1, stride=1, pad=0):
        nodes.append(helper.make_node("Conv", [x, const(out + "_w", wt), const(out + "_b", b)], [out],
                                      group=group, strides=[stride] * 2, pads=[pad] * 4))

    def activation(a, x, out):
        if not a:
            nodes.append(helper.make_node("Identity", [x], [out]))
        elif a == "Clip":
            nodes.append(helper.make_node("Clip", [x, const(out + "_lo", 0.0), const(out + "_hi", 6.0)], [out]))
        elif a == "SiLU":
            nodes.append(helper.make_node("Sigmoid", [x], [out + "_sig"]))
            nodes.append(helper.make_node("Mul", [x, out + "_sig"], [out]))
        else:
            nodes.append(helper.make_node(a, [x], [out]))

    conv("x", rng.standard_normal((e, c, 1, 1)) / np.sqrt(c), rng.standard_normal(e) * 0.1, "e")
    activation(acts[0], "e", "ea")
    conv("ea", rng.standard_normal((e, 1, k, k)) / k, rng.standard_normal(e) * 0.1, "d", group=e, stride=s, pad=k // 2)
    activation(acts[1], "d", "da")
    conv("da", rng.standard_normal((o, e, 1, 1)) / np.sqrt(e), rng.standard_normal(o) * 0.1, "p")
    activation(acts[2], "p", "pa" if residual else "y")
    if residual:
        nodes.append(helper.make_node("Add", ["x", "pa"], ["y"]))
    oh, ow = ((d + 2 * (k // 2) - k) // s + 1 for d in (h, w))
    b = "N" if batch_dim else n
    g = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [b, c, h, w])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [b, o, oh, ow])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def macs(c, e, o, h, k, s) -> int:
    oh = (h + 2 * (k // 2) - k) // s + 1
    return h * h * c * e + oh * oh * e * (k * k + o)


def kernel_ms(m, feeds) -> float:
    """The block's kernels, thread CPU time (the layout conversions at the edges left out)."""
    return sum(sec for what, sec in m.profile(feeds, runs=3)
               if not what.startswith(("ToNCHWc", "FromNCHWc"))) * 1e3


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", default="mobilenet_v2", choices=sorted(BLOCKS))
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = "1"          # read when kiln's first module loads
    time.perf_counter = time.thread_time        # the profile reads this clock: the kernels' own CPU time
    print(f"{'block':38} {'unfused ms':>10} {'fused ms':>9} {'f/u':>5} {'GFLOP/s fused':>13}")
    for spec in BLOCKS[args.blocks]:
        c, e, o, h, k, s, act = spec
        model = block_model(*spec)
        feeds = {"x": np.random.default_rng(1).standard_normal((1, c, h, h)).astype(np.float32)}
        ms = {v: kiln.compile(model, decisions={"conv.inverted_residual": v}) for v in ("unfused", "fused")}
        ys = {v: m.run(feeds)["y"] for v, m in ms.items()}
        err = float(np.max(np.abs(ys["fused"] - ys["unfused"])) / max(1e-30, float(np.max(np.abs(ys["unfused"])))))
        times = {v: [] for v in ms}
        for _ in range(args.rounds):
            for v, m in ms.items():
                times[v].append(kernel_ms(m, feeds))
        u, f = statistics.median(times["unfused"]), statistics.median(times["fused"])
        name = f"{c}->{e}->{o} {h}x{h} k{k} s{s} {act}"
        print(f"{name:38} {u:10.3f} {f:9.3f} {f / u:5.2f} {2 * macs(c, e, o, h, k, s) / f / 1e6:13.1f}"
              f"   (max rel diff {err:.1e})")


if __name__ == "__main__":
    main()
