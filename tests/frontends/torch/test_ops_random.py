"""Translated ATen ops against eager torch on random shapes, dtypes and attributes.

test_ops.py runs each translated op once on a fixed shape; here hypothesis draws the
shapes (rank 0-4, sizes 1-7, broadcasting), the dtypes and the attributes (dims, keepdim,
strides, padding, dilation, groups), so a translation that is only right for the shape
it was written against fails. The module goes through torch.export like a user's
(kiln.compile(module, example_inputs=...)); the interpreter target runs kiln's reference
of the translated graph, which is what these tests check.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from hypothesis import HealthCheck, strategies as st  # noqa: E402
from hypothesis.extra.numpy import array_shapes, mutually_broadcastable_shapes  # noqa: E402

import kiln  # noqa: E402
from tests.frontends.torch.opcheck import Fn, assert_same, rnd  # noqa: E402
from tests.helpers import property_test  # noqa: E402

# 12 examples each under -m slow, 4 in the default suite (each one a torch.export: seconds on CI)
SETTINGS = dict(deadline=None, suppress_health_check=list(HealthCheck))
FLOATS = (torch.float32, torch.float64)
NUMBERS = FLOATS + (torch.int32, torch.int64)


def check(fn, *xs, rtol=1e-5, atol=1e-5):
    m = Fn(fn)
    cm = kiln.compile(m, "interpreter", example_inputs=xs)
    assert_same(cm(*xs), m(*xs), rtol=rtol, atol=atol)


shapes = array_shapes(min_dims=0, max_dims=4, min_side=1, max_side=7)
nonscalar = array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=7)
seeds = st.integers(0, 2**16)

UNARY = {
    "relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "exp": torch.exp, "abs": torch.abs,
    "neg": torch.neg, "erf": torch.erf, "floor": torch.floor, "sin": torch.sin, "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu, "hardswish": F.hardswish,
    "softplus": F.softplus, "leaky_relu": lambda x: F.leaky_relu(x, 0.2), "elu": F.elu,
    "clamp": lambda x: torch.clamp(x, -0.5, 0.7), "square": lambda x: x * x, "pow3": lambda x: x ** 3,
}


@property_test(12, 4, SETTINGS, op=st.sampled_from(sorted(UNARY)), shape=shapes, dtype=st.sampled_from(FLOATS), seed=seeds)
def test_unary(op, shape, dtype, seed):
    torch.manual_seed(seed)
    check(UNARY[op], rnd(*shape, dtype=dtype))


BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "maximum": torch.maximum, "minimum": torch.minimum,
    "lt": torch.lt, "ge": torch.ge, "eq": torch.eq, "where_gt": lambda a, b: torch.where(a > b, a, b),
    "add_alpha": lambda a, b: torch.add(a, b, alpha=2),
}


@property_test(12, 4, SETTINGS, op=st.sampled_from(sorted(BINARY)), shapes=mutually_broadcastable_shapes(num_shapes=2, max_dims=4, max_side=6),
       dtypes=st.tuples(st.sampled_from(NUMBERS), st.sampled_from(NUMBERS)), seed=seeds)
def test_binary_broadcast_and_promotion(op, shapes, dtypes, seed):
    torch.manual_seed(seed)
    a, b = (rnd(*s, dtype=d) for s, d in zip(shapes.input_shapes, dtypes))
    check(BINARY[op], a, b)


@property_test(12, 4, SETTINGS, shapes=mutually_broadcastable_shapes(num_shapes=2, max_dims=4, max_side=6),
       dtypes=st.tuples(st.sampled_from(FLOATS), st.sampled_from(FLOATS)), seed=seeds)
def test_true_division(shapes, dtypes, seed):
    torch.manual_seed(seed)
    a = rnd(*shapes.input_shapes[0], dtype=dtypes[0])
    sb = shapes.input_shapes[1]
    b = ((torch.rand(sb) + 0.5) * (1 - 2 * (torch.rand(sb) > 0.5).float())).to(dtypes[1])
    check(torch.div, a, b)


REDUCE = {
    "sum": lambda x, d, k: x.sum(d, keepdim=k), "mean": lambda x, d, k: x.mean(d, keepdim=k),
    "amax": lambda x, d, k: x.amax(d, keepdim=k), "amin": lambda x, d, k: x.amin(d, keepdim=k),
    "var": lambda x, d, k: torch.var(x, d, keepdim=k, correction=0),
    "norm": lambda x, d, k: torch.linalg.vector_norm(x, dim=d, keepdim=k),
}


@property_test(12, 4, SETTINGS, op=st.sampled_from(sorted(REDUCE)), shape=nonscalar, keep=st.booleans(), data=st.data(), seed=seeds)
def test_reduction_over_random_dims(op, shape, keep, data, seed):
    dims = data.draw(st.lists(st.integers(-len(shape), len(shape) - 1), min_size=1, max_size=len(shape),
                              unique_by=lambda d: d % len(shape)))
    torch.manual_seed(seed)
    check(lambda x: REDUCE[op](x, tuple(dims), keep), rnd(*shape))


@property_test(12, 4, SETTINGS, shape=nonscalar, data=st.data(), log=st.booleans(), seed=seeds)
def test_softmax_random_axis(shape, data, log, seed):
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    torch.manual_seed(seed)
    check(lambda x: (F.log_softmax if log else torch.softmax)(x, dim), rnd(*shape, lo=-6, hi=6))


@property_test(12, 4, SETTINGS, batch=mutually_broadcastable_shapes(num_shapes=2, max_dims=2, max_side=3), m=st.integers(1, 9),
       k=st.integers(1, 9), n=st.integers(1, 9), seed=seeds)
def test_matmul_batch_broadcast(batch, m, k, n, seed):
    torch.manual_seed(seed)
    a = rnd(*batch.input_shapes[0], m, k)
    b = rnd(*batch.input_shapes[1], k, n)
    check(torch.matmul, a, b, rtol=1e-4, atol=1e-5)


@st.composite
def conv2d_cases(draw):
    groups = draw(st.integers(1, 3))
    cin, cout = groups * draw(st.integers(1, 3)), groups * draw(st.integers(1, 3))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dil = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    pad = (draw(st.integers(0, kh // 2 * dil[0])), draw(st.integers(0, kw // 2 * dil[1])))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    h = draw(st.integers(dil[0] * (kh - 1) + 1, 10))
    w = draw(st.integers(dil[1] * (kw - 1) + 1, 10))
    return dict(n=draw(st.integers(1, 2)), cin=cin, cout=cout, hw=(h, w), k=(kh, kw), stride=stride, pad=pad,
                dil=dil, groups=groups, bias=draw(st.booleans()))


@property_test(12, 4, SETTINGS, c=conv2d_cases(), seed=seeds)
def test_conv2d_random_attributes(c, seed):
    torch.manual_seed(seed)
    x = rnd(c["n"], c["cin"], *c["hw"])
    w = rnd(c["cout"], c["cin"] // c["groups"], *c["k"])
    b = rnd(c["cout"]) if c["bias"] else None
    check(lambda x, w: F.conv2d(x, w, b, c["stride"], c["pad"], c["dil"], c["groups"]), x, w, rtol=1e-4, atol=1e-4)


@property_test(12, 4, SETTINGS, kind=st.sampled_from(["max", "avg", "avg_excl"]), k=st.integers(1, 3), s=st.integers(1, 3),
       ceil=st.booleans(), hw=st.tuples(st.integers(3, 9), st.integers(3, 9)), data=st.data(), seed=seeds)
def test_pool2d_random_attributes(kind, k, s, ceil, hw, data, seed):
    p = data.draw(st.integers(0, k // 2))
    torch.manual_seed(seed)
    if kind == "max":
        fn = lambda x: F.max_pool2d(x, k, s, p, ceil_mode=ceil)  # noqa: E731
    else:
        fn = lambda x: F.avg_pool2d(x, k, s, p, ceil_mode=ceil, count_include_pad=kind == "avg")  # noqa: E731
    check(fn, rnd(1, 2, *hw))


@property_test(12, 4, SETTINGS, shape=nonscalar, data=st.data(), seed=seeds)
def test_permute_slice_flip(shape, data, seed):
    perm = data.draw(st.permutations(range(len(shape))))
    axis = data.draw(st.integers(0, len(shape) - 1))
    start = data.draw(st.integers(-shape[axis], shape[axis] - 1))
    step = data.draw(st.integers(1, 3))
    torch.manual_seed(seed)

    def fn(x):
        sl = [slice(None)] * len(shape)
        sl[axis] = slice(start, None, step)
        return torch.flip(x.permute(*perm), (0,)), x[tuple(sl)]
    check(fn, rnd(*shape))


@property_test(12, 4, SETTINGS, shape=nonscalar, n=st.integers(2, 3), data=st.data(), dtype=st.sampled_from(NUMBERS), seed=seeds)
def test_cat_random_axis(shape, n, data, dtype, seed):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    sizes = data.draw(st.lists(st.integers(1, 4), min_size=n, max_size=n))
    torch.manual_seed(seed)
    xs = []
    for size in sizes:
        s = list(shape)
        s[axis] = size
        xs.append(rnd(*s, dtype=dtype))
    check(lambda *xs: torch.cat(xs, axis), *xs)


@property_test(12, 4, SETTINGS, shape=nonscalar, data=st.data(), affine=st.booleans(), seed=seeds)
def test_layer_norm_random_normalized_shape(shape, data, affine, seed):
    r = data.draw(st.integers(1, len(shape)))
    norm = tuple(shape[-r:])
    torch.manual_seed(seed)
    x = rnd(*shape)
    if affine:
        check(lambda x, w, b: F.layer_norm(x, norm, w, b, 1e-5), x, rnd(*norm), rnd(*norm), rtol=1e-4, atol=1e-4)
    else:
        check(lambda x: F.layer_norm(x, norm), x, rtol=1e-4, atol=1e-4)
