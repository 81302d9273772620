"""Native (cpu) lowerings of the NN and image ops against their NumPy references.

Each case is a one-node ONNX model: imported (concrete types), lowered node by node
with `lower_node`, and run natively on random non-zero inputs. All cases are lowered
into one module that is compiled once, so the whole file builds a single C library.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from onnx import helper

import kiln
from kiln.codegen import build_c
from kiln.errors import KilnError
from kiln.interpreter import Interpreter
from kiln.loops import LoopModule
from kiln.lower.kernel import lower_node

rng = np.random.default_rng(0)


def R(*shape, dt=np.float32):
    x = rng.standard_normal(shape).astype(dt)
    x[x == 0] = 0.5
    return x


def U(*shape, dt=np.float32):
    return rng.uniform(0.5, 2.0, shape).astype(dt)


def I(lo, hi, *shape, dt=np.int8):  # noqa: E743
    return rng.integers(lo, hi, shape).astype(dt)


class Case:
    def __init__(self, op, inputs, consts=(), opset=21, n_out=1, tol=1e-4, **attrs):
        self.op, self.inputs, self.consts, self.opset = op, inputs, consts, opset
        self.n_out, self.tol, self.attrs = n_out, tol, attrs

    def model(self):
        names = [n if x is not None else "" for n, x in self.inputs.items()]
        vi = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
              for n, x in self.inputs.items() if x is not None and n not in self.consts]
        inits = [helper.make_tensor(n, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape, x.ravel().tolist())
                 for n, x in self.inputs.items() if n in self.consts and x is not None]
        outs = [f"y{i}" for i in range(self.n_out)]
        node = helper.make_node(self.op, names, outs, name="n0", **self.attrs)
        graph = helper.make_graph([node], "g", vi, [helper.make_value_info(o, helper.TypeProto()) for o in outs],
                                  inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])

    def __repr__(self):
        shapes = "_".join("x".join(map(str, x.shape)) for x in self.inputs.values() if x is not None)
        attrs = ",".join(f"{k}={v}" for k, v in self.attrs.items() if k != "kernel_shape")
        dt = next(iter(self.inputs.values())).dtype
        return f"{self.op}-{shapes}-{dt}-{attrs}"


F16, F64 = np.float16, np.float64
P1 = [1, 1, 1, 1]

CONV = [
    Case("Conv", dict(x=R(1, 3, 11, 11), w=R(4, 3, 3, 3), b=R(4)), ("w", "b"), pads=P1),
    Case("Conv", dict(x=R(1, 3, 11, 11, dt=F64), w=R(4, 3, 3, 3, dt=F64)), ("w",), pads=P1),
    Case("Conv", dict(x=R(1, 3, 11, 11, dt=F16), w=R(4, 3, 3, 3, dt=F16), b=R(4, dt=F16)), ("w", "b"),
         tol=1e-2, pads=P1),
    Case("Conv", dict(x=R(2, 4, 9, 10), w=R(6, 4, 3, 2), b=R(6)), ("w", "b"), strides=[2, 2], pads=[1, 0, 1, 1]),
    Case("Conv", dict(x=R(1, 4, 12, 12), w=R(8, 4, 3, 3)), ("w",), dilations=[2, 2], pads=[2, 2, 2, 2]),
    Case("Conv", dict(x=R(1, 6, 9, 9), w=R(6, 2, 3, 3), b=R(6)), ("w", "b"), group=3, pads=P1),
    Case("Conv", dict(x=R(1, 8, 9, 9), w=R(8, 1, 3, 3), b=R(8)), ("w", "b"), group=8, pads=P1, strides=[2, 2]),
    Case("Conv", dict(x=R(1, 8, 9, 9), w=R(16, 1, 3, 3)), ("w",), group=8, pads=P1),
    Case("Conv", dict(x=R(1, 5, 7, 7), w=R(3, 5, 1, 1), b=R(3)), ("w", "b")),
    Case("Conv", dict(x=R(1, 16, 16, 16), w=R(32, 16, 1, 1), b=R(32)), ("w", "b")),    # read in place
    Case("Conv", dict(x=R(1, 16, 14, 14), w=R(32, 16, 1, 1)), ("w",)),
    Case("Conv", dict(x=R(1, 8, 8, 8), w=R(16, 8, 1, 1)), ("w",), strides=[2, 2]),
    Case("Conv", dict(x=R(1, 4, 10, 10), w=R(4, 4, 3, 3)), ("w",), auto_pad="SAME_UPPER", strides=[2, 2]),
    Case("Conv", dict(x=R(1, 4, 10, 10), w=R(4, 4, 3, 3)), ("w",), auto_pad="SAME_LOWER"),
    Case("Conv", dict(x=R(1, 4, 10, 10), w=R(4, 4, 3, 3)), ("w",), auto_pad="VALID", strides=[3, 2]),
    Case("Conv", dict(x=R(2, 3, 17), w=R(4, 3, 5), b=R(4)), ("w", "b"), pads=[2, 1], strides=[2]),
    Case("Conv", dict(x=R(1, 3, 17), w=R(4, 3, 3)), dilations=[3]),                    # runtime weights
    Case("Conv", dict(x=R(1, 2, 5, 6, 7), w=R(4, 2, 3, 3, 3), b=R(4)), ("w", "b"), pads=[1] * 6),
    Case("Conv", dict(x=R(1, 2, 5, 6, 7), w=R(4, 2, 1, 2, 3)), ("w",), strides=[2, 1, 2]),
    Case("Conv", dict(x=R(1, 3, 20, 20), w=R(8, 3, 7, 7), b=R(8)), ("w", "b"), strides=[2, 2], pads=[3] * 4),
    Case("Conv", dict(x=R(1, 16, 7, 7), w=R(32, 16, 3, 3), b=R(32)), ("w", "b"), pads=P1),
    # depthwise with strides: the plane's columns are read with the stride
    Case("Conv", dict(x=R(1, 4, 17), w=R(8, 1, 5), b=R(8)), ("w", "b"), group=4, strides=[3], pads=[2, 1],
         dilations=[2]),
    Case("Conv", dict(x=R(1, 3, 9, 11), w=R(6, 1, 3, 3)), ("w",), group=3, strides=[2, 3], pads=[0, 1, 1, 1],
         dilations=[1, 2]),
    Case("Conv", dict(x=R(2, 2, 5, 7, 9), w=R(2, 1, 3, 3, 3)), ("w",), group=2, strides=[2, 2, 2], pads=[1] * 6),
    Case("Conv", dict(x=R(1, 8, 13, 13), w=R(8, 1, 5, 5), b=R(8)), ("w", "b"), group=8, strides=[2, 2],
         auto_pad="SAME_UPPER"),
]

POOL = []
for _op in ("MaxPool", "AveragePool", "LpPool"):
    for _a in (dict(kernel_shape=[3, 3], strides=[2, 2], pads=P1),
               dict(kernel_shape=[2, 3], strides=[2, 1], pads=[0, 1, 1, 0], ceil_mode=1),
               dict(kernel_shape=[3, 3], strides=[3, 3], pads=P1, ceil_mode=1, count_include_pad=1),
               dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"),
               dict(kernel_shape=[2, 2], dilations=[2, 2], pads=P1)):
        if _op != "AveragePool":
            _a = {k: v for k, v in _a.items() if k != "count_include_pad"}
        if _op == "LpPool" and "dilations" in _a:
            continue
        POOL.append(Case(_op, dict(x=R(2, 3, 11, 10)), opset=19, **_a))
POOL += [
    Case("MaxPool", dict(x=R(1, 2, 9)), n_out=2, kernel_shape=[3], strides=[2], pads=[1, 1]),
    Case("MaxPool", dict(x=R(2, 2, 9, 8)), n_out=2, kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1],
         storage_order=1),
    Case("MaxPool", dict(x=R(1, 2, 5, 6, 7)), n_out=2, kernel_shape=[2, 2, 2], strides=[2, 2, 2]),
    Case("MaxPool", dict(x=I(-100, 100, 1, 2, 9, 9)), kernel_shape=[3, 3], pads=P1),
    Case("MaxPool", dict(x=I(0, 250, 1, 2, 9, 9, dt=np.uint8)), kernel_shape=[3, 3]),
    Case("AveragePool", dict(x=R(1, 3, 9, 9, dt=F16)), tol=1e-2, kernel_shape=[3, 3], pads=P1),
    Case("AveragePool", dict(x=R(1, 3, 9, 9, 7)), kernel_shape=[3, 3, 3], pads=[1] * 6, count_include_pad=1),
    Case("GlobalAveragePool", dict(x=R(1, 64, 14, 14))),
    Case("GlobalAveragePool", dict(x=R(2, 3, 5))),
    Case("GlobalMaxPool", dict(x=R(2, 3, 7, 7))),
    Case("GlobalLpPool", dict(x=R(2, 3, 7, 7))),
    Case("GlobalLpPool", dict(x=R(2, 3, 7, 7)), p=3),
]

C = 5
NORM = [
    Case("BatchNormalization", dict(x=R(2, C, 4, 3), s=R(C), b=R(C), m=R(C), v=U(C)), ("s", "b", "m", "v"),
         opset=15),
    Case("BatchNormalization", dict(x=R(2, C), s=R(C), b=R(C), m=R(C), v=U(C)), opset=15),
    Case("BatchNormalization", dict(x=R(2, C, 4, 3, 2, dt=F16), s=R(C), b=R(C), m=R(C), v=U(C)), opset=15,
         tol=1e-2),
    Case("BatchNormalization", dict(x=R(2, C, 4, 3), s=R(C), b=R(C), m=R(C), v=U(C)), opset=15,
         training_mode=1, n_out=3),
    Case("BatchNormalization", dict(x=R(2, C, 4, 3), s=R(C), b=R(C), m=R(C), v=U(C)), opset=9, n_out=5),
    Case("InstanceNormalization", dict(x=R(2, C, 4, 3), s=R(C), b=R(C)), epsilon=1e-3),
    Case("LayerNormalization", dict(x=R(2, 3, 8), s=R(8), b=R(8)), opset=17, n_out=3),
    Case("LayerNormalization", dict(x=R(2, 3, 8), s=R(3, 8)), opset=17, axis=1, n_out=3),
    Case("LayerNormalization", dict(x=R(4, 16, dt=F16), s=R(16, dt=F16), b=R(16, dt=F16)), opset=17, tol=1e-2),
    Case("LayerNormalization", dict(x=R(4, 16, dt=F64), s=R(16, dt=F64)), opset=17, stash_type=11),
    Case("RMSNormalization", dict(x=R(2, 3, 8), s=R(8)), opset=23),
    Case("RMSNormalization", dict(x=R(2, 3, 8), s=R(3, 8)), opset=23, axis=1),
    Case("GroupNormalization", dict(x=R(2, 6, 4, 3), s=R(6), b=R(6)), opset=21, num_groups=3),
    Case("GroupNormalization", dict(x=R(2, 6, 4, 3), s=R(3), b=R(3)), opset=18, num_groups=3),
    Case("LpNormalization", dict(x=R(2, 3, 8)), axis=1, p=1),
    Case("LpNormalization", dict(x=np.concatenate([R(2, 3, 4), np.zeros((2, 3, 1), np.float32)], 2)), p=2),
    Case("MeanVarianceNormalization", dict(x=R(2, 3, 4, 5))),
    Case("MeanVarianceNormalization", dict(x=R(2, 3, 4, 5)), axes=[1]),
    Case("LRN", dict(x=R(2, 7, 4, 5)), size=3, alpha=0.1, beta=0.6, bias=2.0),
    Case("LRN", dict(x=R(2, 7, 4, 5)), size=4),
]


def _q(*shape, dt=np.uint8):
    info = np.iinfo(dt)
    return I(info.min, info.max, *shape, dt=dt)


QCONV = [
    Case("ConvInteger", dict(x=_q(1, 3, 7, 7), w=_q(4, 3, 3, 3), xz=np.array(12, np.uint8),
                             wz=np.array(100, np.uint8)), ("w", "wz"), opset=10, pads=P1),
    Case("ConvInteger", dict(x=_q(1, 4, 7, 7, dt=np.int8), w=_q(4, 2, 3, 3, dt=np.int8), xz=np.array([3], np.int8),
                             wz=I(-5, 5, 4)), opset=10, group=2, strides=[2, 2]),
    Case("QLinearConv", dict(x=_q(1, 4, 8, 8), xs=np.array(0.02, np.float32), xz=np.array(120, np.uint8),
                             w=_q(8, 4, 3, 3), ws=U(8) / 200, wz=np.array(128, np.uint8),
                             ys=np.array(0.3, np.float32), yz=np.array(5, np.uint8), b=I(-999, 999, 8, dt=np.int32)),
         ("w", "ws", "wz", "b"), opset=10, pads=P1),
    Case("QLinearConv", dict(x=_q(1, 4, 8, 8, dt=np.int8), xs=np.array(0.02, np.float32), xz=np.array(-3, np.int8),
                             w=_q(4, 1, 3, 3, dt=np.int8), ws=np.array(0.005, np.float32), wz=np.array(0, np.int8),
                             ys=np.array(0.1, np.float32), yz=np.array(-5, np.int8)),
         opset=10, group=4, pads=P1, strides=[2, 2]),
    Case("ConvTranspose", dict(x=R(1, 3, 5, 5), w=R(3, 4, 3, 3), b=R(4)), ("w", "b")),
    Case("ConvTranspose", dict(x=R(1, 4, 5, 6), w=R(4, 3, 3, 2)), strides=[2, 3], pads=[1, 0, 1, 1], group=2),
    Case("ConvTranspose", dict(x=R(1, 3, 5, 5), w=R(3, 2, 3, 3)), strides=[2, 2], output_padding=[1, 1]),
    Case("ConvTranspose", dict(x=R(1, 3, 5, 5), w=R(3, 2, 3, 3)), strides=[2, 2], output_shape=[10, 8]),
    Case("ConvTranspose", dict(x=R(1, 3, 5, 5), w=R(3, 2, 3, 3)), strides=[2, 2], auto_pad="SAME_UPPER",
         dilations=[2, 1]),
    Case("ConvTranspose", dict(x=R(1, 3, 7), w=R(3, 2, 4)), strides=[3], auto_pad="SAME_LOWER"),
    Case("ConvTranspose", dict(x=R(1, 2, 3, 4, 5), w=R(2, 2, 2, 2, 2), b=R(2)), strides=[2, 2, 2]),
]

E0 = np.zeros(0, np.float32)
SC = np.array([1, 1, 2, 1.5], np.float32)
RESIZE = [Case("Resize", dict(x=R(1, 2, 5, 6), roi=E0, s=SC), ("roi", "s"), opset=19, mode=m,
               coordinate_transformation_mode=c)
          for m, c in [("nearest", "half_pixel"), ("nearest", "asymmetric"), ("nearest", "tf_half_pixel_for_nn"),
                       ("linear", "half_pixel"), ("linear", "align_corners"), ("linear", "pytorch_half_pixel"),
                       ("cubic", "half_pixel_symmetric"), ("cubic", "asymmetric")]]
RESIZE += [
    Case("Resize", dict(x=R(1, 2, 8, 9), roi=E0, s=np.array([1, 1, .5, .6], np.float32)), ("roi", "s"), opset=19,
         mode="cubic", antialias=1, exclude_outside=1),
    Case("Resize", dict(x=R(1, 2, 8, 9), roi=E0, s=E0, sz=np.array([5, 20], np.int64)), ("roi", "s", "sz"),
         opset=19, axes=[2, 3], keep_aspect_ratio_policy="not_larger", mode="linear"),
    Case("Resize", dict(x=R(1, 2, 8, 9), roi=np.array([0, 0, .1, .2, 1, 1, .9, 1.2], np.float32), s=E0,
                        sz=np.array([1, 2, 5, 7], np.int64)), ("roi", "s", "sz"), opset=19, mode="linear",
         coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=-3.0),
    Case("Resize", dict(x=_q(1, 2, 5, 6), roi=E0, s=SC), ("roi", "s"), opset=19, mode="cubic"),
    Case("Resize", dict(x=R(1, 2, 5, 6), s=SC), ("s",), opset=10, mode="linear"),
    Case("Upsample", dict(x=R(1, 2, 5, 6), s=np.array([1, 1, 2, 3], np.float32)), ("s",), opset=9),
    Case("Upsample", dict(x=R(1, 2, 5, 6)), opset=7, scales=[1.0, 1.0, 2.0, 2.0], mode="linear"),
]

_IDX = np.array([[[[5, 7], [13, 15]], [[21, 22], [25, 31]]]], np.int64)
_ROIS = np.array([[0, 0, 4, 4], [1, 1, 6, 5], [2.5, 0.5, 3.5, 5.5]], np.float32)
OTHER = [
    Case("CausalConvWithState", dict(x=R(2, 4, 8), w=R(4, 1, 4)), opset=27, n_out=2),
    Case("CausalConvWithState", dict(x=R(2, 4, 8), w=R(4, 1, 4), b=R(4), p=R(2, 4, 3)), opset=27, n_out=2,
         activation="silu"),
    Case("CausalConvWithState", dict(x=R(2, 4, 8, dt=F16), w=R(4, 1, 1, dt=F16)), opset=27, n_out=2, tol=1e-2),
    Case("MaxUnpool", dict(x=R(1, 2, 2, 2), i=_IDX), opset=11, kernel_shape=[2, 2], strides=[2, 2]),
    Case("MaxUnpool", dict(x=R(1, 2, 2, 2), i=_IDX, s=np.array([1, 2, 3, 5], np.int64)), ("s",), opset=11,
         kernel_shape=[2, 2], strides=[2, 2]),
    Case("DeformConv", dict(x=R(1, 4, 6, 7), w=R(6, 2, 3, 3), o=R(1, 36, 6, 7) * 1.5, b=R(6), m=U(1, 18, 6, 7) / 2),
         opset=19, kernel_shape=[3, 3], pads=P1, group=2, offset_group=2),
    Case("DeformConv", dict(x=R(2, 4, 6, 7), w=R(4, 4, 2, 2), o=R(2, 8, 2, 3) * 2), opset=19, strides=[2, 2],
         dilations=[2, 1]),
    Case("Col2Im", dict(x=R(2, 18, 16), i=np.array([6, 7], np.int64), b=np.array([2, 3], np.int64)), ("i", "b"),
         opset=18, strides=[2, 1], pads=[1, 0, 1, 1], dilations=[1, 2]),
    Case("Col2Im", dict(x=R(1, 16, 24), i=np.array([3, 4, 5], np.int64), b=np.array([2, 2, 2], np.int64)),
         ("i", "b"), opset=18),
    Case("AffineGrid", dict(t=R(2, 2, 3), s=np.array([2, 3, 5, 6], np.int64)), ("s",), opset=20, align_corners=1),
    Case("AffineGrid", dict(t=R(2, 3, 4), s=np.array([2, 3, 4, 5, 1], np.int64)), ("s",), opset=20),
    Case("GridSample", dict(x=R(1, 2, 3, 4, 5), g=R(1, 2, 3, 2, 3)), opset=20, padding_mode="reflection"),
    Case("RoiAlign", dict(x=R(2, 3, 8, 7), r=_ROIS, b=np.array([0, 1, 1], np.int64)), opset=16, output_height=3,
         output_width=2, spatial_scale=0.9),
    Case("RoiAlign", dict(x=R(2, 3, 8, 7), r=_ROIS, b=np.array([0, 1, 1], np.int64)), opset=10, mode="max",
         sampling_ratio=2, output_height=2, output_width=3),
]
OTHER += [Case("GridSample", dict(x=R(1, 2, 5, 6), g=R(1, 4, 3, 2) * 0.9), opset=20, mode=m, padding_mode=p,
               align_corners=a)
          for m, p, a in [("nearest", "zeros", 0), ("nearest", "reflection", 1), ("linear", "border", 0),
                          ("linear", "reflection", 0), ("cubic", "zeros", 1), ("cubic", "border", 0)]]

CASES = CONV + POOL + NORM + QCONV + RESIZE + OTHER


def _lower(case, name):
    g = kiln.load_onnx(case.model())
    node = g.nodes[0]
    func = lower_node(node, case.opset, [None if v is None else v.const for v in node.inputs], name)
    return g, node, func


class _Libs:
    def __init__(self, libs):
        self.libs = libs

    def __getitem__(self, name):
        return next(lib for lib in self.libs if name in lib.kernels)[name]


@pytest.fixture(scope="module")
def built():
    """Lower every case (remembering failures); compile the kernels as a few modules, concurrently."""
    lowered, funcs = {}, []
    for k, case in enumerate(CASES):
        try:
            g, node, func = _lower(case, f"k{k}")
        except Exception as e:  # reported by the case's own test
            lowered[k] = e
            continue
        lowered[k] = (g, node)
        funcs.append(func)
    chunks = [funcs[i::4] for i in range(4)]
    with ThreadPoolExecutor(4) as pool:
        libs = list(pool.map(lambda fs: build_c(LoopModule(fs)), [c for c in chunks if c]))
    return _Libs(libs), lowered


@pytest.mark.parametrize("k", range(len(CASES)), ids=[repr(c) for c in CASES])
def test_lowering_matches_reference(built, k):
    lib, lowered = built
    case = CASES[k]
    if isinstance(lowered[k], Exception):
        raise lowered[k]
    g, node = lowered[k]
    ins = [x for x in case.inputs.values() if x is not None]
    outs = [np.full(v.type.shape, 7, v.type.dtype.np) for v in node.outputs]
    lib[f"k{k}"](*ins, *outs)
    ref = Interpreter(g).run([x for n, x in case.inputs.items() if x is not None and n not in case.consts])
    for got, want in zip(outs, ref):
        assert got.dtype == want.dtype and got.shape == want.shape
        if got.dtype.kind in "iub":
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, rtol=case.tol, atol=case.tol * 0.1)


def test_conv_schedule_blocks_registers_and_vectorizes():
    """The conv kernel's reduction runs in a register block with the q loop vectorized;
    it forks only when the work pays for waking sleeping threads."""
    from kiln.lower.nnutil import parallel_worth
    from kiln.targets.target import Target
    host = Target.host()
    small = Case("Conv", dict(x=R(1, 16, 14, 14), w=R(32, 16, 3, 3)), ("w",), pads=P1)
    big = Case("Conv", dict(x=R(1, 64, 28, 28), w=R(64, 64, 3, 3)), ("w",), pads=P1)
    for case, macs in ((small, 32 * 16 * 9 * 196), (big, 64 * 64 * 9 * 784)):
        text = str(_lower(case, "c")[2])
        assert "acc.local" in text and "vectorized for" in text
        assert ("parallel for" in text) == parallel_worth(macs, host, "conv")
    assert parallel_worth(64 * 64 * 9 * 784, host, "conv") and not parallel_worth(1000, host, "conv")


def test_conv_takes_a_fused_elementwise_epilogue():
    """Conv -> Add(residual) -> Relu lowered as one group: the conv's schedule tiles the epilogue."""
    from kiln.lower.kernel import lower_group
    from kiln.targets.target import Target
    x, w, b, r = R(1, 8, 10, 10), R(16, 8, 3, 3), R(16), R(1, 16, 10, 10)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=P1),
             helper.make_node("Add", ["c", "r"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    vi = [helper.make_tensor_value_info(n, 1, v.shape) for n, v in (("x", x), ("r", r))]
    inits = [helper.make_tensor(n, 1, v.shape, v.ravel().tolist()) for n, v in (("w", w), ("b", b))]
    graph = helper.make_graph(nodes, "g", vi, [helper.make_value_info("y", helper.TypeProto())], inits)
    g = kiln.load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    k = lower_group(g.nodes, {id(n): 17 for n in g.nodes},
                    {id(n): [None if v is None else v.const for v in n.inputs] for n in g.nodes},
                    lambda v: False, "fused", Target.host())
    text = str(k.func)
    assert "acc.local" in text and "vectorized for" in text
    args = {v.name: v.const if v.const is not None else {"x": x, "r": r}[v.name] for v in k.inputs}
    y = np.zeros((1, 16, 10, 10), np.float32)
    build_c(k.func)["fused"](*[np.ascontiguousarray(args[v.name]) for v in k.inputs], y)
    np.testing.assert_allclose(y, Interpreter(g).run([x, r])[0], rtol=1e-4, atol=1e-5)


def test_resize_needs_compile_time_scales():
    case = Case("Resize", dict(x=R(1, 2, 5, 6), roi=E0, s=SC), ("roi",), opset=19)
    with pytest.raises(KilnError, match="scales known at compile time"):
        _lower(case, "r")


def test_lowering_rejects_bad_knob():
    case = Case("Conv", dict(x=R(1, 6, 5, 5), w=R(6, 6, 3, 3)), ("w",))
    g = kiln.load_onnx(case.model())
    node = g.nodes[0]
    with pytest.raises(KilnError, match=r"illegal value 4 for decision 'conv.oct' in kernel 'bad'.*must "
                                        r"divide the 6 output channels"):
        lower_node(node, case.opset, [v.const for v in node.inputs], "bad", decisions={"bad": {"conv.oct": 4}})
