"""Winograd F(4x4, 3x3)'s float32 error on real CNNs' 3x3 convs: kiln's native kernel against the
direct convolution in float64, with each model's own weights (BatchNorm folded, as kiln runs them).

    python benchmarks/winograd_error.py [--models resnet50,unet] [--dir ~/.cache/kiln-corpus]
    python benchmarks/winograd_error.py --1d [--m 4,6]    # 1-D F(m, 3) on 3-tap stride-1 1-D convs
    python benchmarks/winograd_error.py --1d --strided    # 1-D F(m, r) on strided ones (input phases)

Per model, over its 3x3 stride-1 dense convs (inputs: ReLU of unit normals at the conv's own
input size): the largest |error| / max |direct output| ("rel"), the largest |error| /
(|direct| + 1e-3 max |direct|) ("elem": under 1e-3 means it passes rtol 1e-3 with that atol
floor), and the same two for the direct convolution in float32 (numpy) for scale. The bound
tests/lower/test_winograd.py asserts is stated from these figures.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import kiln  # noqa: E402
from kiln.graph import parse_graph  # noqa: E402
from kiln.ops.layout import from_blocked, to_blocked  # noqa: E402
from kiln.ops.nn import Window, conv_core  # noqa: E402
from kiln.ops.winograd import transform_weight  # noqa: E402
from kiln.passes.layout import _window_attrs, default_block  # noqa: E402
from kiln.targets.target import Target  # noqa: E402

CACHE = os.path.expanduser("~/.cache/kiln-corpus")


def _dense_convs(path: str, ndim: int):
    """(node, weights, x shape, window attrs) of each ungrouped Conv with `ndim`-D constant
    weights and static non-batch sizes, BN folded, at the model's first benchmark case (its
    sidecar .json) when its sizes are symbolic."""
    import json
    from kiln.compiler import run_stages
    side = path[:-5] + ".json"
    dims = json.load(open(side))["cases"][0] if os.path.exists(side) else {}
    g = run_stages(path, "partition", opt_level=2, dims=dims).specialized.graph
    opset = g.opset("")
    for n in g.nodes:
        if n.op != "Conv" or n.domain or n.inputs[1].const is None:
            continue
        w, xs = n.inputs[1].const, n.inputs[0].type.shape
        if w.ndim != ndim or int(n.attrs.get("group", 1)) != 1 or xs is None \
                or not all(isinstance(d, int) for d in xs[1:]):
            continue
        yield n, w, xs, _window_attrs(n, opset, (1, *xs[1:]), w.shape[2:])


def convs_3x3(path: str):
    """(name, x shape (1, C, H, W), weights, pads) of each 3x3 stride-1 dense conv, BN folded,
    at the model's first benchmark case (its sidecar .json) when its sizes are symbolic."""
    for n, w, xs, a in _dense_convs(path, 4):
        if w.shape[2:] != (3, 3):
            continue
        if a is None or a["strides"] != [1, 1] or a["dilations"] != [1, 1]:
            continue
        yield n.name, (1, *xs[1:]), w.astype(np.float32), a["pads"]


def convs_1d(path: str):
    """(name, x shape (1, C, L), weights, [left, right], dilation, stride) of each dense 1-D conv
    Winograd can run (3 taps at stride 1; strided, undilated, 2-3 taps per input phase), BN
    folded, at the model's first benchmark case."""
    for n, w, xs, a in _dense_convs(path, 3):
        if a is None:
            continue
        k, st, d = w.shape[2], a["strides"][1], a["dilations"][1]
        if (st == 1 and k != 3) or (st > 1 and (d > 1 or -(-k // st) not in (2, 3))):
            continue
        yield n.name, (1, *xs[1:]), w.astype(np.float32), [a["pads"][1], a["pads"][3]], d, st


_MODELS: dict = {}


def native(xs, oc, pads, block):
    """A compiled graph of one ConvWinograd with x and u as inputs (one per geometry)."""
    key = (xs, oc, tuple(pads))
    if key not in _MODELS:
        n, c, h, w = xs
        cb, ocb = -(-c // block), -(-oc // block)
        oh, ow = h + pads[0] + pads[2] - 2, w + pads[1] + pads[3] - 2
        text = (f'graph "g" (%x: float32[1,{cb},{h},{w},{block}], %u: float32[36,{ocb},{cb * block},{block}]) '
                f'-> (%y)\n  opsets {{"": 17, "kiln": 1}}\n{{\n'
                f'  %y: float32[1,{ocb},{oh},{ow},{block}] = "kiln"::ConvWinograd(%x, %u) '
                f'{{m = 4, pads = [{", ".join(map(str, pads))}]}} name "wino"\n}}')
        _MODELS[key] = kiln.compile(parse_graph(text))
    return _MODELS[key]


def native_1d(xs, oc, pads, d, m, block, k=3, st=1):
    """A compiled graph of one ConvWinograd1D with x and u as inputs (one per geometry)."""
    key = (xs, oc, tuple(pads), d, m, k, st)
    if key not in _MODELS:
        _, c, length = xs
        cb, ocb = -(-c // block), -(-oc // block)
        ow = (length + pads[0] + pads[1] - (k - 1) * d - 1) // st + 1
        nt = m + -(-k // st) - 1
        text = (f'graph "g" (%x: float32[1,{cb},1,{length},{block}], '
                f'%u: float32[{nt},{ocb},{cb * block * st},{block}]) -> (%y)\n  opsets {{"": 17, "kiln": 1}}\n{{\n'
                f'  %y: float32[1,{ocb},1,{ow},{block}] = "kiln"::ConvWinograd1D(%x, %u) '
                f'{{m = {m}, pads = [{pads[0]}, {pads[1]}], dilation = {d}, kernel = {k}, stride = {st}}} '
                f'name "wino"\n}}')
        _MODELS[key] = kiln.compile(parse_graph(text))
    return _MODELS[key]


def main_1d(args, block, rng):
    """Per model and m: the worst errors over its 3-tap stride-1 1-D convs."""
    from kiln.ops.winograd1d import transform_weight_1d
    ms = [int(v) for v in args.m.split(",")]
    worst = {m: [0.0, 0.0] for m in ms}
    dworst = [0.0, 0.0]
    for path in sorted(glob.glob(os.path.join(args.dir, "*.onnx"))):
        name = os.path.basename(path)[:-5]
        if args.models and name not in args.models.split(","):
            continue
        rows = {m: [] for m in ms}
        drows = []
        for cname, xs, w, pads, d, st in convs_1d(path):
            if args.strided != (st > 1):
                continue
            k = w.shape[2]
            x = np.maximum(rng.standard_normal(xs), 0).astype(np.float32)
            ow = (xs[2] + pads[0] + pads[1] - (k - 1) * d - 1) // st + 1
            win = Window([k], [st], [d], [pads[0]], [pads[1]], [ow], [0])
            want = conv_core(None, x.astype(np.float64), w.astype(np.float64), 1, win)
            drows.append(errors(conv_core(None, x, w, 1, win), want))
            for m in ms:
                y = native_1d(xs, w.shape[0], pads, d, m, block, k, st).run(
                    x=to_blocked(x[:, :, None], block), u=transform_weight_1d(w, block, m, st))["y"]
                rows[m].append(errors(from_blocked(y, w.shape[0])[:, :, 0], want))
        if not drows:
            continue
        dr = np.max(np.array(drows), axis=0)
        dworst = [max(a, b) for a, b in zip(dworst, dr)]
        line = f"{name:22s} {len(drows):3d} convs | "
        for m in ms:
            r = np.max(np.array(rows[m]), axis=0)
            worst[m] = [max(a, b) for a, b in zip(worst[m], r)]
            line += f"F({m},{'r' if args.strided else 3}) rel {r[0]:.2e} elem {r[1]:.2e} | "
        print(line + f"direct f32 rel {dr[0]:.2e} elem {dr[1]:.2e}", flush=True)
    print(f"{'all':22s}           | " + "".join(f"F({m},3) rel {worst[m][0]:.2e} elem {worst[m][1]:.2e} | "
                                               for m in ms) + f"direct f32 rel {dworst[0]:.2e} elem {dworst[1]:.2e}")


def errors(got, want) -> tuple[float, float]:
    big = float(np.max(np.abs(want)))
    err = np.abs(got - want)
    return float(err.max() / big), float(np.max(err / (np.abs(want) + 1e-3 * big)))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="")
    ap.add_argument("--dir", default=CACHE)
    ap.add_argument("--1d", dest="one_d", action="store_true", help="1-D F(m, 3) on 3-tap stride-1 1-D convs")
    ap.add_argument("--m", default="4,6", help="with --1d: the tile sizes m to measure")
    ap.add_argument("--strided", action="store_true", help="with --1d: the strided convs (polyphase F(m, r))")
    args = ap.parse_args(argv)
    block = default_block(Target.host())
    rng = np.random.default_rng(0)
    if args.one_d:
        return main_1d(args, block, rng)
    worst = [0.0, 0.0, 0.0, 0.0]
    for path in sorted(glob.glob(os.path.join(args.dir, "*.onnx"))):
        name = os.path.basename(path)[:-5]
        if args.models and name not in args.models.split(","):
            continue
        rows = []
        for cname, xs, w, pads in convs_3x3(path):
            x = np.maximum(rng.standard_normal(xs), 0).astype(np.float32)
            win = Window([3, 3], [1, 1], [1, 1], pads[:2], pads[2:],
                         [xs[2] + pads[0] + pads[2] - 2, xs[3] + pads[1] + pads[3] - 2], [0, 0])
            want = conv_core(None, x.astype(np.float64), w.astype(np.float64), 1, win)
            d32 = conv_core(None, x, w, 1, win)
            y = native(xs, w.shape[0], pads, block).run(
                x=to_blocked(x, block), u=transform_weight(w, block))["y"]
            got = from_blocked(y, w.shape[0])
            rows.append((*errors(got, want), *errors(d32, want)))
        if not rows:
            continue
        r = np.max(np.array(rows), axis=0)
        worst = [max(a, b) for a, b in zip(worst, r)]
        print(f"{name:22s} {len(rows):3d} convs | winograd rel {r[0]:.2e} elem {r[1]:.2e} | "
              f"direct f32 rel {r[2]:.2e} elem {r[3]:.2e}", flush=True)
    print(f"{'all':22s}           | winograd rel {worst[0]:.2e} elem {worst[1]:.2e} | "
          f"direct f32 rel {worst[2]:.2e} elem {worst[3]:.2e}")


if __name__ == "__main__":
    main()
