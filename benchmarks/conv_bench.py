"""Per-conv microbenchmark: kiln -O3's NCHW conv kernel (layout pass off), kiln's blocked
ConvNCHWc kernel (its input already blocked, so no conversions are timed) and ONNX Runtime on
the same Conv+Relu, interleaved in one process on the same seeded input; prints the median and
p10 ms and GFLOP/s of each, after checking both kiln kernels against ORT.

    python benchmarks/conv_bench.py --convs resnet18 --rounds 15 --per-round 5 [--only l1_3x3,l4_3x3]
    python benchmarks/conv_bench.py --convs depthwise      # MobileNet/EfficientNet depthwise convs
    python benchmarks/conv_bench.py --convs conv1d         # 1-D convs: strided front ends, dilated
    python benchmarks/conv_bench.py --convs strided        # a detector's 3x3 stride-2 convs
    python benchmarks/conv_bench.py --convs grouped        # ResNeXt-50 32x4d's grouped 3x3 convs
    python benchmarks/conv_bench.py --convs grouped --batch 4 --clock cpu     # 4 images a call

A 1-D conv runs blocked as the 2-D ConvNCHWc of N,C,1,L (what transform_layout makes of it).
The timings include each engine's per-call overhead (tens of microseconds); OMP_NUM_THREADS
sets kiln's threads, --threads ORT's. `--clock cpu` runs every engine on one thread and times the
calling thread's CPU time (robust to a loaded machine; caches are still shared).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("KILN_TIER", "full")   # time the -O3 build, never a quick tier (kiln.codegen.tiers)

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import kiln  # noqa: E402
from kiln.bench import ort_session, stats, time_interleaved, time_thread_cpu  # noqa: E402
from kiln.ops.layout import from_blocked, pack_bias, pack_conv_weight, to_blocked  # noqa: E402
from kiln.passes.layout import default_block  # noqa: E402
from kiln.targets.target import Target  # noqa: E402

# name: (c, h, oc, k, stride, pad[, depthwise[, dilation]]); h a tuple (L,) for a 1-D conv
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
    "conv1d": {     # strided front ends and dilated residual convs of audio nets (1 s at 16 kHz)
        "k10s5_1ch": (1, (16000,), 128, 10, 5, 0),
        "k8s4": (128, (3199,), 128, 8, 4, 0),
        "k4s2": (128, (798,), 128, 4, 2, 0),
        "k3d1": (128, (398,), 128, 3, 1, 1),
        "k3d4": (128, (398,), 128, 3, 1, 4, False, 4),
        "k3d16": (128, (398,), 128, 3, 1, 16, False, 16),
        "k1": (128, (398,), 128, 1, 1, 0),
        "k10s5_512": (1, (16000,), 512, 10, 5, 0),
        "k3s2_512": (512, (3199,), 512, 3, 2, 0),
        "k2s2_512": (512, (99,), 512, 2, 2, 0),
    },
    # 1x1 convs of ResNet-50 (bottleneck in/out, stride-2 projections) and MobileNetV2 (expand /
    # project) at 224: where they are compute-bound, issue 13 asks 75% of the FMA peak
    "pointwise": {
        "r50_64_64x56": (64, 56, 64, 1, 1, 0),
        "r50_64_256x56": (64, 56, 256, 1, 1, 0),
        "r50_256_64x56": (256, 56, 64, 1, 1, 0),
        "r50_256_128x56": (256, 56, 128, 1, 1, 0),
        "r50_128_512x28": (128, 28, 512, 1, 1, 0),
        "r50_512_128x28": (512, 28, 128, 1, 1, 0),
        "r50_512_256x28": (512, 28, 256, 1, 1, 0),
        "r50_256_1024x14": (256, 14, 1024, 1, 1, 0),
        "r50_1024_256x14": (1024, 14, 256, 1, 1, 0),
        "r50_1024_512x14": (1024, 14, 512, 1, 1, 0),
        "r50_512_2048x7": (512, 7, 2048, 1, 1, 0),
        "r50_2048_512x7": (2048, 7, 512, 1, 1, 0),
        "r50_ds256_512s2": (256, 56, 512, 1, 2, 0),
        "r50_ds1024_2048s2": (1024, 14, 2048, 1, 2, 0),
        "mv2_16_96x112": (16, 112, 96, 1, 1, 0),
        "mv2_144_24x56": (144, 56, 24, 1, 1, 0),
        "mv2_24_144x56": (24, 56, 144, 1, 1, 0),
        "mv2_192_32x28": (192, 28, 32, 1, 1, 0),
        "mv2_64_384x14": (64, 14, 384, 1, 1, 0),
        "mv2_384_64x14": (384, 14, 64, 1, 1, 0),
        "mv2_576_96x14": (576, 14, 96, 1, 1, 0),
        "mv2_160_960x7": (160, 7, 960, 1, 1, 0),
        "mv2_960_160x7": (960, 7, 160, 1, 1, 0),
        "mv2_320_1280x7": (320, 7, 1280, 1, 1, 0),
    },
    # the grouped 3x3 convs of ResNeXt-50 32x4d at 224: 32 groups of 4, 8, 16 and 32 channels
    # (spec: ..., depthwise, dilation, groups)
    "grouped": {
        "g32x4_128x56": (128, 56, 128, 3, 1, 1, False, 1, 32),
        "g32x8_256x56s2": (256, 56, 256, 3, 2, 1, False, 1, 32),
        "g32x8_256x28": (256, 28, 256, 3, 1, 1, False, 1, 32),
        "g32x16_512x28s2": (512, 28, 512, 3, 2, 1, False, 1, 32),
        "g32x16_512x14": (512, 14, 512, 3, 1, 1, False, 1, 32),
        "g32x32_1024x14s2": (1024, 14, 1024, 3, 2, 1, False, 1, 32),
        "g32x32_1024x7": (1024, 7, 1024, 3, 1, 1, False, 1, 32),
    },
    # 1x1 convs of MobileNetV3-Large (224) whose input's last channel block is half padding at
    # 16 lanes (24, 40, 72, 120, 184, 200 channels): kiln.lower.nchwc._narrow_sum
    "narrow": {
        "mv3_24_72x56": (24, 56, 72, 1, 1, 0),
        "mv3_40_120x28": (40, 28, 120, 1, 1, 0),
        "mv3_40_240x28": (40, 28, 240, 1, 1, 0),
        "mv3_72_40x28": (72, 28, 40, 1, 1, 0),
        "mv3_120_40x28": (120, 28, 40, 1, 1, 0),
        "mv3_200_80x14": (200, 14, 80, 1, 1, 0),
        "mv3_184_80x14": (184, 14, 80, 1, 1, 0),
    },
    # 1x1 convs of MobileNetV3-Large (224) with 5 or 7 output channel blocks at 16 lanes (80, 72
    # and 112 channels: no tile of 2-4 blocks divides them; kiln.lower.nchwc._block_counts)
    "prime_blocks": {
        "mv3_24_72x56": (24, 56, 72, 1, 1, 0),
        "mv3_240_80x14": (240, 14, 80, 1, 1, 0),
        "mv3_200_80x14": (200, 14, 80, 1, 1, 0),
        "mv3_480_112x14": (480, 14, 112, 1, 1, 0),
        "mv3_672_112x14": (672, 14, 112, 1, 1, 0),
    },
    # the stems of MobileNetV2, V3 and ResNet at 224: 3 input channels, read as one block of
    # all 3 (kiln.passes.layout_rules.input_block)
    "stems": {
        "mv2_stem3x3s2": (3, 224, 32, 3, 2, 1),
        "mv3_stem3x3s2": (3, 224, 16, 3, 2, 1),
        "r18_stem7x7s2": (3, 224, 64, 7, 2, 3),
    },
    "strided": {    # 3x3 stride-2 downsampling convs of detectors (320x320 input)
        "s2_32_64": (32, 160, 64, 3, 2, 1),
        "s2_64_128": (64, 80, 128, 3, 2, 1),
        "s2_128_256": (128, 40, 256, 3, 2, 1),
        "s2_256_512": (256, 20, 512, 3, 2, 1),
        "3x3_64": (64, 80, 64, 3, 1, 1),
        "1x1_128_64": (128, 40, 64, 1, 1, 0),
    },
    "strided640": {     # the same detector at 640x640: feature maps past the L2, the 6x6 stem
        "stem6x6s2": (3, 640, 32, 6, 2, 2),
        "s2_32_64": (32, 320, 64, 3, 2, 1),
        "s2_64_128": (64, 160, 128, 3, 2, 1),
        "s2_128_256": (128, 80, 256, 3, 2, 1),
        "s2_256_512": (256, 40, 512, 3, 2, 1),
    },
}


def _dims(spec):
    """(c, spatial dims, oc, k, s, p, depthwise, dilation, groups) of a CONVS entry."""
    c, h, oc, k, s, p, *rest = spec
    rest = list(rest) + [False, 1, 1][len(rest):]
    return (c, (h, h) if isinstance(h, int) else tuple(h), oc, k, s, p, bool(rest[0]), int(rest[1]),
            c if rest[0] else int(rest[2]))


def _out(h, k, s, p, d):
    return (h + 2 * p - (k - 1) * d - 1) // s + 1


def onnx_conv(c, sp, oc, k, s, p, w, b, dw=False, d=1, group=1, batch=1):
    nd = len(sp)
    o = [_out(h, k, s, p, d) for h in sp]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[k] * nd, strides=[s] * nd,
                              pads=[p] * 2 * nd, dilations=[d] * nd, group=c if dw else group),
             helper.make_node("Relu", ["c"], ["y"])]
    g = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, c, *sp])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, oc, *o])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), o


def blocked_graph(c, sp, oc, k, s, p, w, b, block, dw=False, d=1, group=1, batch="1"):
    """The blocked conv + ReLU alone (a 1-D conv as 1 x L; a few input channels read as one
    block; a grouped conv as the layout pass runs it: rotated or in block groups; `batch` a
    number or a symbol, as a model with a symbolic batch compiles it); returns the graph and
    the input's channel block."""
    from kiln.ops.layout import block_groups, pack_grouped_weight, pack_rotated_weight
    from kiln.passes.layout import narrow_input
    from kiln.passes.layout_rules import rotated
    from tests.passes.util import graph
    one = len(sp) == 1
    grouped = group > 1 and not dw
    ib = c if not grouped and narrow_input(c, block, dw) else block
    cb, ocb = -(-c // ib), -(-oc // block)
    h, wd = (1, sp[0]) if one else sp
    oh, ow = (1 if one else _out(h, k, s, p, d)), _out(wd, k, s, p, d)
    kh, sh, ph, dh = (1, 1, 0, 1) if one else (k, s, p, d)
    wp = w.reshape(w.shape[0], w.shape[1], kh, k)
    extra = ""
    if grouped and rotated(c, oc, group, block):
        extra, dw, packed = f", rotate = {c // group}", True, pack_rotated_weight(wp, block)
    elif grouped:
        extra, packed = f", groups = {block_groups(c, oc, group, block)}", pack_grouped_weight(wp, group, block)
    else:
        packed = pack_conv_weight(wp, block, dw, None if dw else ib)
    text = (f'graph "g" (%x: float32[{batch},{cb},{h},{wd},{ib}]) -> (%y)\n  opsets {{"": 17, "kiln": 1}}\n{{\n'
            f'  %c: float32[{batch},{ocb},{oh},{ow},{block}] = "kiln"::ConvNCHWc(%x, %w, %b) {{kernel_shape = [{kh}, {k}], '
            f'strides = [{sh}, {s}], pads = [{ph}, {p}, {ph}, {p}], dilations = [{dh}, {d}], '
            f'depthwise = {int(dw)}{extra}}} name "conv"\n'
            f'  %y: float32[{batch},{ocb},{oh},{ow},{block}] = Relu(%c) name "relu"\n}}')
    return graph(text, w=packed, b=pack_bias(b, oc, block, np.float32)), ib


def timed(fns: dict, args) -> dict:
    """One warm-up call each, then the stats of args.rounds * args.per_round timed calls of each:
    thread CPU time (--clock cpu) or wall time interleaved."""
    for f in fns.values():
        f()
    if args.clock == "cpu":
        t = time_thread_cpu(fns, args.rounds * args.per_round)
    else:
        t = time_interleaved(fns, {k: args.rounds * args.per_round for k in fns}, args.rounds)
    return {k: stats(v) for k, v in t.items()}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--convs", default="resnet18")
    ap.add_argument("--only", default="")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--per-round", type=int, default=5)
    ap.add_argument("--no-nchw", action="store_true")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="ORT intra-op threads")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    ap.add_argument("--batch", type=int, default=1, help="images per call")
    args = ap.parse_args(argv)
    if args.clock == "cpu":
        os.environ["OMP_NUM_THREADS"] = "1"    # read when kiln's first module loads
        args.threads = 1
    block = default_block(Target.host())
    rng = np.random.default_rng(0)
    peak = None
    if args.clock == "cpu":     # one thread: each kernel's GFLOP/s against one core's measured peak
        from benchmarks.fma_peak import peak_gflops  # noqa: PLC0415
        peak = peak_gflops(block)
        print(f"FMA peak of one thread: {peak:.1f} GFLOP/s float32 (benchmarks/fma_peak.py)")
    for name, spec in CONVS[args.convs].items():
        if args.only and name not in args.only.split(","):
            continue
        c, sp, oc, k, s, p, dw, d, group = _dims(spec)
        nd = len(sp)
        cg = c // group
        w = rng.standard_normal((oc, cg) + (k,) * nd).astype(np.float32) / np.float32(np.sqrt(cg * k ** nd))
        b = rng.standard_normal(oc).astype(np.float32)
        x = rng.standard_normal((args.batch, c, *sp)).astype(np.float32)
        model, o = onnx_conv(c, sp, oc, k, s, p, w, b, dw, d, group, args.batch)
        flops = 2 * oc * cg * k ** nd * int(np.prod(o)) * args.batch
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
        bg, ib = blocked_graph(c, sp, oc, k, s, p, w, b, block, dw, d, group, batch=str(args.batch))
        mb = kiln.compile(bg, target="cpu", opt_level=3)
        xb = to_blocked(x.reshape(args.batch, c, 1, *sp) if nd == 1 else x, ib)
        got = mb.run({"x": xb})
        got = got["y"] if isinstance(got, dict) else got[0]
        np.testing.assert_allclose(from_blocked(got, oc).reshape(want.shape), want, rtol=1e-3, atol=1e-3)
        fns["nchwc"] = lambda: mb.run({"x": xb})
        st = timed(fns, args)
        print(f"{name:12s} {flops / 1e9:.3f} GF | " + " | ".join(
            f"{kk} {v['median_ms']:.3f} ms (p10 {v['p10_ms']:.3f}) {flops / v['median_ms'] / 1e6:.0f} GF/s"
            + (f" {flops / v['p10_ms'] / 1e6 / peak:.0%} of peak at p10" if peak and kk == "nchwc" else "")
            for kk, v in st.items()), flush=True)


if __name__ == "__main__":
    main()
