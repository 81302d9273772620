"""conv_transpose_to_conv: a non-overlapping ConvTranspose (kernel = stride) runs as a 1x1 Conv
and a DepthToSpace; ConvTranspose+BN folds first. Checked against the reference interpreter on
random shapes (hypothesis): odd sizes, batch > 1, symbolic batch/H/W, with and without bias/BN."""

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.frontends.onnx import load_onnx
from kiln.passes import run_passes
from tests.helpers import examples

F = np.float32


def _model(c, m, k, *, bias, bn, sym, attrs=None, opset=17, seed=0):
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (c, m, k, k)).astype(F), "w")]
    ins = ["x", "w"]
    attrs = attrs if attrs is not None else {"kernel_shape": [k, k], "strides": [k, k]}
    mo = m * attrs.get("group", 1)   # output channels
    if bias:
        inits.append(numpy_helper.from_array(rng.normal(0, 0.1, mo).astype(F), "b"))
        ins.append("b")
    nodes = [helper.make_node("ConvTranspose", ins, ["t" if bn else "y"], **attrs)]
    if bn:
        for name, arr in [("s", rng.uniform(0.5, 1.5, mo)), ("bb", rng.normal(0, 0.1, mo)),
                          ("mu", rng.normal(0, 0.1, mo)), ("var", rng.uniform(0.5, 2, mo))]:
            inits.append(numpy_helper.from_array(arr.astype(F), name))
        nodes.append(helper.make_node("BatchNormalization", ["t", "s", "bb", "mu", "var"], ["y"]))
    dims = ["n", c, "h", "w"] if sym else [2, c, 5, 7]
    g = helper.make_graph(nodes, "ct", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _ops(model):
    g, _ = run_passes(load_onnx(model))
    return [n.op for n in g.nodes]


def _x(n, c, h, w, seed=1):
    x = np.random.default_rng(seed).standard_normal((n, c, h, w)).astype(F)
    x[x == 0] = 0.5
    return x


@examples(8)
def test_matches_reference(examples):
    settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck),
             phases=[Phase.explicit, Phase.reuse, Phase.generate])(
        given(c=st.integers(1, 20), m=st.integers(1, 19), k=st.integers(2, 3), n=st.integers(1, 3),
              h=st.integers(1, 9), w=st.integers(1, 9), bias=st.booleans(), bn=st.booleans(),
              sym=st.booleans())(_matches_reference))()


def _matches_reference(c, m, k, n, h, w, bias, bn, sym):
    model = _model(c, m, k, bias=bias, bn=bn, sym=sym)
    ops = _ops(model)
    assert "ConvTranspose" not in ops and "BatchNormalization" not in ops and "DepthToSpace" in ops
    if not sym:
        n, h, w = 2, 5, 7
    x = _x(n, c, h, w)
    want = kiln.compile(model, "interpreter", opt_level=0)(x)
    got = kiln.compile(model)(x)
    assert got.shape == (n, m, h * k, w * k)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3], "strides": [2, 2]},                            # overlapping windows
    {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [0, 0, 1, 1]},      # cropped
    {"kernel_shape": [2, 2], "strides": [2, 2], "output_padding": [1, 1]},  # grown
    {"kernel_shape": [2, 2], "strides": [2, 2], "group": 2},
])
def test_other_conv_transposes_stay(attrs):
    k = attrs["kernel_shape"][0]
    model = _model(4, 2 if attrs.get("group") else 3, k, bias=True, bn=False, sym=False, attrs=attrs)
    assert "ConvTranspose" in _ops(model)
    x = _x(2, 4, 5, 7)
    np.testing.assert_allclose(kiln.compile(model)(x), kiln.compile(model, "interpreter", opt_level=0)(x),
                               rtol=1e-4, atol=1e-5)


def test_old_opset_stays():
    """DepthToSpace's mode attribute needs opset 11."""
    assert "ConvTranspose" in _ops(_model(4, 3, 2, bias=False, bn=False, sym=False, opset=10))


@pytest.mark.parametrize("group", [1, 2])
def test_bn_folds_into_grouped_conv_transpose(group):
    model = _model(4, 3, 3, bias=True, bn=True, sym=False,
                   attrs={"kernel_shape": [3, 3], "strides": [2, 2], "group": group})
    ops = _ops(model)
    assert "BatchNormalization" not in ops and "ConvTranspose" in ops
    x = _x(2, 4, 5, 7)
    np.testing.assert_allclose(kiln.compile(model)(x), kiln.compile(model, "interpreter", opt_level=0)(x),
                               rtol=1e-4, atol=1e-5)
