"""Native (C) lowerings of the elementwise ops against their NumPy references.

Each test lowers a batch of one-node models, builds them as one C module (cached by
source hash) and compares every kernel with the interpreter on random inputs.
"""

import ml_dtypes
import numpy as np
import pytest
from onnx import helper, numpy_helper

import kiln
from kiln.codegen import build_c, emit_c
from kiln.errors import KilnError
from kiln.interpreter import Interpreter
from kiln.loops import LoopModule
from kiln.lower.kernel import lower_node

F32, F16, F64 = np.float32, np.float16, np.float64
INTS = (np.int8, np.uint8, np.int16, np.int32, np.int64, np.uint32, np.uint64)


class Const:
    """An input known at compile time (an initializer), e.g. Dropout's training_mode."""

    def __init__(self, value):
        self.value = np.asarray(value)


class Case:
    """One node: op, inputs (arrays; None: an absent optional input; Const: an initializer),
    attributes, opset, number of outputs and a tolerance (None: by dtype)."""

    def __init__(self, op, inputs, opset=21, rtol=None, atol=None, outputs=1, **attrs):
        self.op, self.inputs, self.opset, self.attrs = op, list(inputs), opset, attrs
        self.rtol, self.atol, self.outputs = rtol, atol, outputs

    def __repr__(self):
        dts = ",".join(str(getattr(x, "value", x).dtype) for x in self.inputs if x is not None)
        return f"{self.op}({dts}){self.attrs or ''}@{self.opset}"

    @property
    def runtime(self):
        return [x for x in self.inputs if isinstance(x, np.ndarray)]

    def graph(self):
        names = ["" if x is None else f"x{k}" for k, x in enumerate(self.inputs)]
        vi = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
              for n, x in zip(names, self.inputs) if isinstance(x, np.ndarray)]
        inits = [numpy_helper.from_array(x.value, n)
                 for n, x in zip(names, self.inputs) if isinstance(x, Const)]
        outs = [f"y{k}" for k in range(self.outputs)]
        node = helper.make_node(self.op, names, outs, name="n0", **self.attrs)
        model = helper.make_model(
            helper.make_graph([node], "g", vi, [helper.make_empty_tensor_value_info(o) for o in outs],
                              initializer=inits),
            opset_imports=[helper.make_opsetid("", self.opset)])
        return kiln.load_onnx(model)


def check(cases):
    """Lower every case, build them as one module, run and compare with the interpreter."""
    graphs = [c.graph() for c in cases]
    nodes = [g.nodes[0] for g in graphs]
    consts = [[None if v is None else v.const for v in n.inputs] for n in nodes]
    mod = build_c(LoopModule([lower_node(n, c.opset, vs, f"k{k}")
                              for k, (c, n, vs) in enumerate(zip(cases, nodes, consts))]))
    for k, (c, g, node) in enumerate(zip(cases, graphs, nodes)):
        want = Interpreter(g).run(c.runtime)
        got = [np.empty_like(w) for w in want]
        xs = iter(c.runtime)  # kernel params: every present input (constants too), then the outputs
        args = [v.const if v.const is not None else next(xs) for v in node.inputs if v is not None]
        mod[f"k{k}"](*[np.require(x, requirements="C") for x in args], *got)
        for w, y in zip(want, got):
            assert y.dtype == w.dtype and y.shape == w.shape, c
            if w.dtype.kind == "f":
                # atol: one rounding of an O(1) intermediate, where gcc's FMA contraction or
                # cancellation (e.g. HardSigmoid's alpha*x + beta near 0) makes the difference
                size = w.dtype.itemsize
                rtol = c.rtol if c.rtol is not None else {2: 2e-3, 4: 1e-5, 8: 1e-12}[size]
                atol = c.atol if c.atol is not None else {2: 1e-3, 4: 1e-7, 8: 1e-15}[size]
                np.testing.assert_allclose(y, w, rtol=rtol, atol=atol, equal_nan=True, err_msg=repr(c))
            else:
                np.testing.assert_array_equal(y, w, err_msg=repr(c))


def rnd(shape, dtype, lo=-3.0, hi=3.0, seed=0):
    """Random non-zero values of `dtype` in [lo, hi) (integers: the whole small range)."""
    rng = np.random.default_rng(seed)
    if np.dtype(dtype) == np.bool_:
        return rng.random(shape) < 0.5
    if np.dtype(dtype).kind == "f":
        x = rng.uniform(lo, hi, shape).astype(dtype)
        return np.where(x == 0, dtype(0.5), x).astype(dtype)
    info = np.iinfo(dtype)
    x = rng.integers(max(info.min, -100), min(info.max, 100), shape, endpoint=True).astype(dtype)
    return np.where(x == 0, 1, x).astype(dtype)


UNARY_FLOAT = ["Abs", "Neg", "Sign", "Relu", "Ceil", "Floor", "Round", "Exp", "Sin", "Cos", "Tan",
               "Atan", "Sinh", "Cosh", "Asinh", "Tanh", "Erf", "Sigmoid", "Softsign", "Softplus", "Mish",
               "HardSwish", "Elu", "Celu", "Selu", "LeakyRelu", "ThresholdedRelu", "HardSigmoid", "Swish",
               "Gelu", "Shrink", "IsNaN", "IsInf", "Reciprocal"]
POSITIVE = ["Log", "Sqrt", "Acosh"]   # domain x > 1 drawn for these
UNIT = ["Asin", "Acos", "Atanh"]      # domain |x| < 1


@pytest.mark.parametrize("dtype", [F32, F16, F64])
def test_unary_float(dtype):
    x = rnd((3, 5, 7), dtype)
    x.flat[:4] = [0.5, -2.5, 1.5, 2.5]  # Round's halves go to even
    cases = [Case(op, [x]) for op in UNARY_FLOAT]
    cases += [Case(op, [rnd((4, 33), dtype, 1.0, 5.0)]) for op in POSITIVE]
    cases += [Case(op, [rnd((4, 33), dtype, -0.99, 0.99)]) for op in UNIT]
    check(cases)


def test_unary_attributes_and_tails():
    x = rnd((2, 3, 40), F32, -6, 6)
    x.flat[:6] = [-80.0, -100.0, 60.0, 1e-6, -1e-6, -0.0]
    cases = [Case("Elu", [x], alpha=0.7), Case("Celu", [x], alpha=2.0), Case("Celu", [x], alpha=-0.5),
             Case("Selu", [x], alpha=1.2, gamma=0.8), Case("LeakyRelu", [x], alpha=-0.3),
             Case("ThresholdedRelu", [x], alpha=0.25), Case("HardSigmoid", [x], alpha=0.4, beta=0.3),
             Case("Swish", [x], opset=24, alpha=1.7), Case("Shrink", [x], bias=1.5, lambd=2.0),
             Case("Softplus", [x]), Case("Sigmoid", [x]), Case("Mish", [x]),
             Case("Gelu", [x], opset=20),
             # 1 + tanh(..) cancels for x << 0: compare where it is well-conditioned
             Case("Gelu", [rnd((40,), F32)], opset=20, rtol=1e-4, atol=1e-6, approximate="tanh"),
             Case("Shrink", [rnd((5, 6), np.int32)], bias=1.5, lambd=3.0),
             Case("Shrink", [rnd((5, 6), np.int8)], lambd=20.0)]
    check(cases)


def test_unary_special_values():
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 3.5, -100.0, -90.0, -30.0, 100.0, 1e-6,
                  -1e-7], F32)
    ops = ("IsNaN", "Relu", "Sign", "Abs", "Neg", "Sigmoid", "Softplus", "Elu", "Mish", "Swish", "Selu",
           "HardSwish", "HardSigmoid")  # (HardSwish's clip does not keep NaN: its product does)
    cases = [Case(op, [x], atol=1e-40) for op in ops]  # tails: no flush to 0 (denormals differ in ulps)
    cases += [Case("IsInf", [x], detect_positive=p, detect_negative=n) for p in (0, 1) for n in (0, 1)]
    check(cases)


def test_sigmoid_float32_every_range():
    """float32 Sigmoid and Swish (kiln_sigmoid_f32: exp by a polynomial, 2^n from bits) against
    float64 over the whole range: near 0, both tails, where exp(-|x|) turns denormal (|x| > 87)
    and underflows (|x| > 104), huge values and random bit patterns (NaN and inf among them)."""
    rng = np.random.default_rng(7)
    x = np.concatenate([np.linspace(-120, 120, 24001), rng.standard_normal(4000) * 10,
                        np.float32(10.0) ** rng.uniform(-30, 38, 2000) * rng.choice([-1, 1], 2000),
                        np.nextafter(np.float32([87, 88, 103, 104, 105]), np.float32(0)) * -1]).astype(F32)
    x = np.concatenate([x, rng.integers(0, 2 ** 32, 4000, dtype=np.uint32).view(F32)])
    mod = build_c(LoopModule([lower_node(Case(op, [x]).graph().nodes[0], 21, [None], f"k{k}")
                              for k, op in enumerate(("Sigmoid", "Swish"))]))
    with np.errstate(all="ignore"):
        e = np.exp(-np.abs(x.astype(F64)))
        sig = np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(F32)   # the float32 sigmoid, rounded once
        # Swish: x times it, as the reference; 3.9e-7 relative where the sigmoid is a normal float,
        # a few of a denormal's steps (1.4e-45) below, times |x| <= 104 in Swish
        for k, (want, atol) in enumerate(((sig, 1e-44), (x * sig, 1e-42))):
            got = np.empty_like(x)
            mod[f"k{k}"](x, got)
            np.testing.assert_allclose(got, want, rtol=5e-7, atol=atol, equal_nan=True)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8])
def test_unary_integer(dtype):
    x = rnd((4, 9), dtype)
    cases = [Case(op, [x]) for op in ("Abs", "Neg", "Sign", "Relu", "BitwiseNot")]
    check(cases + [Case("Not", [rnd((3, 4), np.bool_)]), Case("Identity", [x])])


SHAPES = [((3, 4, 5), (3, 4, 5)), ((3, 4, 5), (5,)), ((), (2, 3)), ((2, 1, 1, 7), (1, 6, 1))]
ARITH = ["Add", "Sub", "Mul", "Div", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "PRelu"]


@pytest.mark.parametrize("dtype", [F32, F16, F64, np.int32, np.int8, np.uint16, np.int64])
def test_binary_broadcast(dtype):
    """Every op on operands broadcasting both ways; the shared broadcast helper on more shapes."""
    a, b = rnd((3, 1, 5), dtype, seed=1), rnd((4, 1), dtype, seed=2)
    is_float = np.dtype(dtype).kind == "f"
    cases = [Case(op, [a, b]) for op in ARITH + (["Pow"] if is_float else [])]
    cases += [Case("Mod", [a, b], fmod=1)] + ([] if is_float else [Case("Mod", [a, b])])  # float: below
    for k, (sa, sb) in enumerate(SHAPES):
        cases += [Case("Sub", [rnd(sa, dtype, seed=k), rnd(sb, dtype, seed=k + 10)]),
                  Case("Sub", [rnd(sb, dtype, seed=k), rnd(sa, dtype, seed=k + 10)])]
    check(cases)


def test_float_mod():
    a = rnd((40,), F32, -10, 10)
    b = rnd((40,), F32, -3, 3)
    a[:4], b[:4] = [6.0, -6.0, 1.0, 5.0], [3.0, 3.0, 0.0, -2.5]
    check([Case("Mod", [a, b]), Case("Mod", [a.astype(F16), b.astype(F16)]), Case("Mod", [a, b], fmod=1)])


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.uint64])
def test_integer_division_edges(dtype):
    """Truncation toward zero / sign of the divisor, extremes, x % -1 (MIN % -1 is 0; x / 0,
    x % 0 and MIN / -1 are errors: tests/runtime/test_memory_safety.py)."""
    a = rnd((8, 12), dtype, seed=1)
    b = rnd((12,), dtype, seed=2)
    b[b == 0] = 1
    a[0, :3] = [np.iinfo(dtype).min, np.iinfo(dtype).max, 7]
    if np.dtype(dtype).kind == "i":
        b[3:5] = [-1, -1]
        a[:, 3] = np.iinfo(dtype).min
    bd = b.copy()
    bd[3] = 1 if np.dtype(dtype).kind == "i" else bd[3]   # Div's MIN / -1 does not fit
    check([Case("Div", [a, bd]), Case("Mod", [a, b]), Case("Mod", [a, b], fmod=1)])


def test_pow_mixed_types():
    rng = np.random.default_rng(3)
    base = rnd((4, 6), F32, 0.5, 3)
    ints = rng.integers(-4, 5, (4, 6))
    cases = [Case("Pow", [base, ints.astype(np.int64)]), Case("Pow", [base, ints.astype(np.int32)]),
             Case("Pow", [base, rnd((6,), F64, -2, 2)]),
             Case("Pow", [base.astype(F16), rnd((6,), F32, -2, 2)]),
             Case("Pow", [rnd((4, 6), F64, 0.5, 3), rnd((6,), F32, -2, 2)])]
    for dt, et in [(np.int32, np.int64), (np.int64, np.int64), (np.int8, np.int32), (np.uint8, np.uint8)]:
        a = rng.integers(-5 if np.dtype(dt).kind == "i" else 0, 6, (5, 8)).astype(dt)
        e = rng.integers(0, 9, (8,)).astype(et)
        e[:3] = [0, 63, 7] if np.dtype(et).itemsize > 1 else [0, 1, 7]
        cases += [Case("Pow", [a, e])]
        if np.dtype(et).kind == "i":
            e2 = np.minimum(e, 7)
            e2[3] = -2  # the reference then takes every element through float64 (exact below 2**53)
            cases += [Case("Pow", [a, e2])]
        cases += [Case("Pow", [np.abs(a), rnd((8,), F32, 0, 3)])]
    check(cases)


def test_pow_by_small_constant_exponents():
    """Known exponents 2, 3, 4 become multiplications; others (and negative bases) still agree."""
    x = rnd((5, 9), F32, -3, 3)
    cases = [Case("Pow", [x, Const(np.array(k, F32))]) for k in (2.0, 3.0, 4.0)]
    cases += [Case("Pow", [x.astype(F64), Const(np.array([3.0], F64))]),
              Case("Pow", [np.abs(x) + 0.1, Const(np.array(2.5, F32))]),
              Case("Pow", [x, Const(np.array(3.0, F64))])]   # computed in float64, as the reference
    check(cases)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint32, np.int16, np.int64])
def test_bitwise_and_shift(dtype):
    a = rnd((5, 7), dtype)
    bits = np.dtype(dtype).itemsize * 8
    amount = np.arange(7).astype(dtype) * (bits // 4)  # 0 .. beyond the width
    if np.dtype(dtype).kind == "i":
        amount[1] = -1
    cases = [Case(op, [a, rnd((7,), dtype, seed=5)]) for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor")]
    cases += [Case("BitShift", [a, amount], direction=d) for d in ("LEFT", "RIGHT")]
    check(cases)


def test_logic():
    a, b = rnd((3, 4, 5), np.bool_, seed=1), rnd((4, 1), np.bool_, seed=2)
    check([Case(op, [a, b]) for op in ("And", "Or", "Xor", "Equal")])


def test_legacy_broadcast_attributes():
    a, b = rnd((2, 3, 4, 5), F32), rnd((3, 4), F32, seed=1)
    cases = [Case("Add", [a, b], opset=6, broadcast=1, axis=1),
             Case("Mul", [a, rnd((2,), F32)], opset=6, broadcast=1, axis=0),
             Case("Sub", [a, rnd((5,), F32)], opset=6, broadcast=1),
             Case("PRelu", [a, rnd((3,), F32, seed=2)], opset=6)]
    check(cases)


@pytest.mark.parametrize("dtype", [F32, F16, np.int32])
def test_variadic(dtype):
    x0, x1, x2 = rnd((3, 4), dtype, seed=0), rnd((4,), dtype, seed=1), rnd((2, 1, 1), dtype, seed=2)
    if np.dtype(dtype).kind == "f":
        x0[0, 0], x1[1] = np.nan, np.nan
    cases = [Case(op, [x0, x1, x2]) for op in ("Max", "Min", "Sum", "Mean")]
    cases += [Case(op, [x0]) for op in ("Max", "Sum", "Mean")]
    check(cases)


def test_where_and_clip():
    c = rnd((3, 1, 5), np.bool_)
    x, y = rnd((4, 5), F32, seed=1), rnd((3, 4, 1), F32, seed=2)
    xi = rnd((6, 7), np.int32)
    lo, hi = np.array(-1.0, F32), np.array([1.5], F32)
    nan_x = x.copy()
    nan_x[0, :2] = [np.nan, 10]
    cases = [Case("Where", [c, x, y]), Case("Where", [c, xi[:4, :5].copy(), rnd((5,), np.int32)]),
             Case("Clip", [nan_x, lo, hi]), Case("Clip", [x, None, hi]), Case("Clip", [x, lo]),
             Case("Clip", [x]),
             Case("Clip", [x.astype(F16), lo.astype(F16), hi.astype(F16)]),
             Case("Clip", [xi, np.array(-20, np.int32), np.array(30, np.int32)]),
             Case("Clip", [nan_x], opset=6, min=-0.5, max=0.75), Case("Clip", [x], opset=6, max=0.0)]
    check(cases)


def test_clip_and_relu_against_constants_keep_nans():
    """Constant bounds clamp as one max / min a vector (`b > y ? b : y`; kiln.codegen.c's
    maxc / minc for Relu's 0): a NaN input stays NaN, a NaN bound still makes NaN, values past
    the bounds and the bounds themselves are exact; the C has no NaN-testing helper left."""
    x = rnd((5, 37), F32, -9, 9, seed=4)
    x.flat[:7] = [np.nan, -np.inf, np.inf, -1.0, 6.0, -0.0, 0.0]
    lo, hi = np.array(-1.0, F32), np.array([6.0], F32)
    cases = [Case("Clip", [x, Const(lo), Const(hi)]), Case("Clip", [x, Const(lo)]),
             Case("Clip", [x, None, Const(hi)]), Case("Clip", [x, Const(np.array(np.nan, F32)), Const(hi)]),
             Case("Clip", [x.astype(F16), Const(lo.astype(F16)), Const(hi.astype(F16))]),
             Case("Clip", [rnd((6, 7), np.int32), Const(np.array(-20, np.int32)), Const(np.array(30, np.int32))]),
             Case("Relu", [x]), Case("Max", [x, Const(np.array(2.5, F32))])]
    check(cases)
    graphs = [c.graph() for c in cases[:3] + cases[6:7]]
    text = emit_c(LoopModule([lower_node(g.nodes[0], 21, [None if v is None else v.const for v in g.nodes[0].inputs],
                                         f"k{k}") for k, g in enumerate(graphs)]))
    assert "a != a" not in text and "kiln_maxc_f32" in text


def test_casts():
    f = rnd((4, 6), F32, -300, 300)
    f.flat[:3] = [0.0, 0.4, -0.7]  # -> bool False/True, -> int truncates toward zero
    cases = [Case("Cast", [f], to=int(helper.np_dtype_to_tensor_dtype(np.dtype(t))))
             for t in (np.int32, np.int16, np.int64, np.float16, np.float64, np.bool_)]
    cases += [Case("Cast", [rnd((4, 6), t)], to=1) for t in (np.int8, np.uint8, np.int64, np.bool_, F16)]
    cases += [Case("Cast", [rnd((5,), F64, -1e5, 1e5)], to=10), Case("Cast", [rnd((5,), np.int32)], to=6),
              Case("Cast", [rnd((2, 3), np.int64)], opset=6, to=11),
              Case("CastLike", [f, np.zeros((1,), np.int32)]), Case("CastLike", [rnd((3,), np.bool_), f])]
    check(cases)


def test_identity_dropout_swiglu_bitcast():
    x = rnd((3, 8), F32)
    cases = [Case("Identity", [x]), Case("Dropout", [x], opset=7, outputs=1),
             Case("Dropout", [x], opset=10, outputs=2), Case("Dropout", [x], opset=6, outputs=2, is_test=1),
             Case("Dropout", [x, Const(F32(0.3)), Const(False)], opset=13, outputs=2),
             Case("Dropout", [x, Const(F32(0.0)), Const(True)], opset=13, outputs=2),
             Case("SwiGLU", [x, rnd((3, 8), F32, seed=3)], opset=28, alpha=1.3),
             Case("SwiGLU", [x.astype(F16), rnd((3, 8), F16, seed=3)], opset=28),
             Case("BitCast", [x], opset=26, to=6)]
    check(cases)


def test_unsupported_cases_fail_clearly():
    x = rnd((3, 8), F32)
    g = Case("Dropout", [x.astype(ml_dtypes.bfloat16), np.array(0.5, F32), np.array(True)], opset=13,
             outputs=2).graph()  # training-mode Dropout is a C kernel (tests/targets)
    with pytest.raises(KilnError, match="bfloat16 has no C type for the training-mode kernel"):
        lower_node(g.nodes[0], 13, [None] * 3, "k")
    g = Case("Cast", [x], to=8).graph()  # string (bfloat16 & co. are C storage dtypes)
    with pytest.raises(KilnError, match="string"):
        lower_node(g.nodes[0], 21, [None], "k")


def test_pow_integer_results_are_exact_beyond_float64():
    a = np.array([3, -3, 7, 2, 5], np.int64)
    e = np.array([39, 39, 22, 62, 27], np.int64)  # > 2**53: float64 pow would lose the low bits
    check([Case("Pow", [a, e])])


def test_empty_and_scalar_shapes():
    e, z = np.zeros((0,), F32), np.zeros((2, 0, 3), F32)
    s = np.array(-0.75, F32)
    check([Case("Sigmoid", [e]), Case("Add", [z, rnd((3,), F32)]), Case("Elu", [z]), Case("Sigmoid", [s]),
           Case("Mod", [s, np.array(0.5, F32)]), Case("Max", [s, e]), Case("Cast", [z], to=7)])
