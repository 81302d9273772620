"""Hostile input values and shapes against native kernels: each gives a KilnError naming the
node (or the right answer), never an out-of-bounds access, a wrapped value or a clamp.

Models are built with onnx.helper; inputs are random apart from the one bad value. ONNX
Runtime raises on the same inputs (Gather out of range, integer division by zero), so kiln does.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

import kiln
from kiln.errors import KilnError

RNG = np.random.default_rng(11)


def model(nodes, inputs, outputs, inits=(), opset=21):
    g = h.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)])


def vi(name, dt, shape):
    return h.make_tensor_value_info(name, dt, shape)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def run(m, **feeds):
    return kiln.compile(m, target="cpu").run(feeds)


# ---- TensorScatter: the bounds check must not overflow ----

def _tensor_scatter(mode="linear"):
    return model([h.make_node("TensorScatter", ["past", "upd", "wi"], ["y"], name="ts", mode=mode)],
                 [vi("past", T.FLOAT, [2, 8, 4]), vi("upd", T.FLOAT, [2, 3, 4]), vi("wi", T.INT64, [2])],
                 [vi("y", T.FLOAT, [2, 8, 4])], opset=24)


@pytest.mark.parametrize("w", [2**63 - 2, 2**63 - 1, 6, -1, -2**63])
def test_tensor_scatter_huge_write_index_fails(w):
    c = kiln.compile(_tensor_scatter(), target="cpu")
    with pytest.raises(KilnError, match=rf"TensorScatter node 'ts'.*write_indices value {w}\b"):
        c.run(past=rand(2, 8, 4), upd=rand(2, 3, 4), wi=np.array([0, w], np.int64))


@pytest.mark.parametrize("w", [2**63 - 2, -2**63, 5])
def test_tensor_scatter_circular_huge_index_matches_reference(w):
    m = _tensor_scatter("circular")
    feeds = dict(past=rand(2, 8, 4), upd=rand(2, 3, 4), wi=np.array([1, w], np.int64))
    got = kiln.compile(m, target="cpu").run(feeds)["y"]
    want = kiln.compile(m, target="interpreter").run(feeds)["y"]
    np.testing.assert_array_equal(got, want)


def test_tensor_scatter_in_range_is_exact():
    m = _tensor_scatter()
    feeds = dict(past=rand(2, 8, 4), upd=rand(2, 3, 4), wi=np.array([5, 0], np.int64))
    y = run(m, **feeds)["y"]
    want = feeds["past"].copy()
    want[0, 5:8], want[1, 0:3] = feeds["upd"][0], feeds["upd"][1]
    np.testing.assert_array_equal(y, want)


# ---- shape relations checked by inference ----

def _linear_attention(qs, ks, vs):
    node = h.make_node("LinearAttention", ["q", "k", "v"], ["y", "st"], name="la", q_num_heads=2,
                       kv_num_heads=2, update_rule="linear")
    return model([node], [vi("q", T.FLOAT, qs), vi("k", T.FLOAT, ks), vi("v", T.FLOAT, vs)],
                 [vi("y", T.FLOAT, None), vi("st", T.FLOAT, None)], opset=26)


@pytest.mark.parametrize("ks,vs", [((1, 2, 8), (1, 2, 8)), ((1, 8, 8), (1, 3, 8)), ((1, 8, 4), (1, 8, 8)),
                                   ((2, 8, 8), (1, 8, 8))])
def test_linear_attention_key_value_must_fit_query(ks, vs):
    with pytest.raises(KilnError, match="LinearAttention node 'la'.*key"):
        kiln.compile(_linear_attention((1, 8, 8), ks, vs), target="cpu")


def test_linear_attention_matching_shapes_run():
    m = _linear_attention((1, 8, 8), (1, 8, 8), (1, 8, 6))
    feeds = dict(q=rand(1, 8, 8), k=rand(1, 8, 8), v=rand(1, 8, 6))
    got = kiln.compile(m, target="cpu").run(feeds)
    want = kiln.compile(m, target="interpreter").run(feeds)
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("nb", [0, 1, 8])
def test_conv_bias_length_must_be_output_channels(nb):
    w = numpy_helper.from_array(rand(4, 2, 3, 3), "W")
    b = numpy_helper.from_array(rand(nb), "B")
    m = model([h.make_node("Conv", ["x", "W", "B"], ["y"], name="conv")], [vi("x", T.FLOAT, [1, 2, 5, 5])],
              [vi("y", T.FLOAT, None)], inits=[w, b])
    with pytest.raises(KilnError, match=rf"Conv node 'conv'.*bias.*\({nb},\).*\(4,\)"):
        kiln.compile(m, target="cpu")


def test_conv_runtime_bias_of_wrong_length_is_refused():
    w = numpy_helper.from_array(rand(4, 2, 3, 3), "W")
    m = model([h.make_node("Conv", ["x", "W", "b"], ["y"], name="conv")],
              [vi("x", T.FLOAT, [1, 2, 5, 5]), vi("b", T.FLOAT, [3])], [vi("y", T.FLOAT, None)], inits=[w])
    with pytest.raises(KilnError, match="bias"):
        kiln.compile(m, target="cpu")


@pytest.mark.parametrize("op,names", [("BatchNormalization", ["x", "s", "b", "m", "v"]),
                                      ("InstanceNormalization", ["x", "s", "b"])])
def test_norm_channel_params_must_fit_channels(op, names):
    params = [numpy_helper.from_array(np.abs(rand(3 if k == 2 else 4)) + 0.5, n)
              for k, n in enumerate(names[1:], 1)]
    m = model([h.make_node(op, names, ["y"], name="norm")], [vi("x", T.FLOAT, [2, 4, 5])],
              [vi("y", T.FLOAT, None)], inits=params)
    with pytest.raises(KilnError, match=rf"{op} node 'norm'.*input 2.*\(3,\).*\(4,\)"):
        kiln.compile(m, target="cpu")


def test_attention_key_value_must_fit_each_other():
    m = model([h.make_node("Attention", ["q", "k", "v"], ["y"], name="att")],
              [vi("q", T.FLOAT, [1, 2, 4, 8]), vi("k", T.FLOAT, [1, 2, 6, 8]), vi("v", T.FLOAT, [1, 2, 5, 8])],
              [vi("y", T.FLOAT, None)], opset=23)
    with pytest.raises(KilnError, match="Attention node 'att'.*do not fit"):
        kiln.compile(m, target="cpu")


# ---- gathers and scatters: an index out of range raises (as ONNX Runtime does) ----

def _gather(op, data_shape, idx_shape, **attrs):
    return model([h.make_node(op, ["x", "i"], ["y"], name="g", **attrs)],
                 [vi("x", T.FLOAT, data_shape), vi("i", T.INT64, idx_shape)], [vi("y", T.FLOAT, None)])


@pytest.mark.parametrize("bad", [4, -5, 2**63 - 1, -2**63])
def test_gather_runtime_index_out_of_range_raises(bad):
    c = kiln.compile(_gather("Gather", [4, 3], [3]), target="cpu")
    with pytest.raises(KilnError, match=rf"Gather node 'g'.*index {bad} is out of range \[-4, 3\]"):
        c.run(x=rand(4, 3), i=np.array([1, bad, 0]))
    # the model still works on good indices afterwards (no state left behind)
    x, i = rand(4, 3), np.array([3, -4, 0])
    np.testing.assert_array_equal(c.run(x=x, i=i)["y"], x[[3, 0, 0]])


def test_gather_constant_index_out_of_range_fails_at_compile_time():
    idx = numpy_helper.from_array(np.array([0, 9], np.int64), "i")
    m = model([h.make_node("Gather", ["x", "i"], ["y"], name="g", axis=1)], [vi("x", T.FLOAT, [2, 4])],
              [vi("y", T.FLOAT, None)], inits=[idx])
    with pytest.raises(KilnError, match="Gather node 'g'.*9"):
        kiln.compile(m, target="cpu", opt_level=0)


def test_gather_elements_and_nd_out_of_range_raise():
    c = kiln.compile(_gather("GatherElements", [3, 4], [3, 2], axis=1), target="cpu")
    idx = np.zeros((3, 2), np.int64)
    idx[2, 1] = 4
    with pytest.raises(KilnError, match=r"GatherElements node 'g'.*index 4 .*\[-4, 3\]"):
        c.run(x=rand(3, 4), i=idx)
    c = kiln.compile(_gather("GatherND", [3, 4], [2, 2]), target="cpu")
    with pytest.raises(KilnError, match=r"GatherND node 'g'.*index -5 .*axis 1"):
        c.run(x=rand(3, 4), i=np.array([[0, 1], [2, -5]]))
    x, i = rand(3, 4), np.array([[0, 1], [2, -4]])
    np.testing.assert_array_equal(c.run(x=x, i=i)["y"], x[[0, 2], [1, 0]])


@pytest.mark.parametrize("op", ["ScatterElements", "ScatterND"])
def test_scatter_index_out_of_range_raises(op):
    shape = [3, 4]
    idx_shape, upd_shape = ([2, 4], [2, 4]) if op == "ScatterElements" else ([2, 1], [2, 4])
    m = model([h.make_node(op, ["x", "i", "u"], ["y"], name="s")],
              [vi("x", T.FLOAT, shape), vi("i", T.INT64, idx_shape), vi("u", T.FLOAT, upd_shape)],
              [vi("y", T.FLOAT, None)], opset=18)
    c = kiln.compile(m, target="cpu")
    idx = np.zeros(idx_shape, np.int64)
    idx[1, 0] = 2**62
    with pytest.raises(KilnError, match=rf"{op} node 's'.*index {2**62} is out of range"):
        c.run(x=rand(*shape), i=idx, u=rand(*upd_shape))


# ---- integer division ----

def _binary(op, dt):
    return model([h.make_node(op, ["a", "b"], ["y"], name="d")], [vi("a", dt, [4]), vi("b", dt, [4])],
                 [vi("y", dt, [4])])


@pytest.mark.parametrize("npdt,dt", [(np.int32, T.INT32), (np.int64, T.INT64), (np.uint8, T.UINT8)])
@pytest.mark.parametrize("op", ["Div", "Mod"])
def test_integer_division_by_zero_raises(op, npdt, dt):
    for target in ("cpu", "interpreter"):
        c = kiln.compile(_binary(op, dt), target=target)
        with pytest.raises(KilnError, match=rf"{op} node 'd'.*by zero"):
            c.run(a=np.array([5, 6, 7, 8], npdt), b=np.array([1, 2, 0, 3], npdt))


@pytest.mark.parametrize("npdt,dt", [(np.int32, T.INT32), (np.int64, T.INT64)])
def test_integer_division_overflow_raises_and_mod_is_zero(npdt, dt):
    low = np.iinfo(npdt).min
    a, b = np.array([7, low, -7, low], npdt), np.array([2, -1, 2, 3], npdt)
    for target in ("cpu", "interpreter"):
        with pytest.raises(KilnError, match=rf"Div node 'd'.*{low} / -1 does not fit"):
            kiln.compile(_binary("Div", dt), target=target).run(a=a, b=b)
    y = kiln.compile(_binary("Mod", dt), target="cpu").run(a=a, b=b)["y"]
    np.testing.assert_array_equal(y, np.mod(a, b))
    y = kiln.compile(_binary("Div", dt), target="cpu").run(a=a, b=np.array([2, 1, 2, 3], npdt))["y"]
    np.testing.assert_array_equal(y, np.array([3, low, -3, -((-int(low)) // 3)], npdt))


# ---- other kernels that index with data (the audit) ----

def _both_raise(m, feeds, pattern):
    """The native kernel and the reference both refuse the input, naming the node."""
    for target in ("cpu", "interpreter"):
        with pytest.raises(KilnError, match=pattern):
            kiln.compile(m, target=target).run(feeds)


def test_reverse_sequence_length_out_of_range_raises():
    m = model([h.make_node("ReverseSequence", ["x", "n"], ["y"], name="r", batch_axis=1, time_axis=0)],
              [vi("x", T.FLOAT, [4, 3]), vi("n", T.INT64, [3])], [vi("y", T.FLOAT, None)])
    _both_raise(m, dict(x=rand(4, 3), n=np.array([1, 9, 2])), r"ReverseSequence node 'r'.*\b9\b.*\[0, 4\]")


def test_rotary_position_ids_out_of_range_raise():
    node = h.make_node("RotaryEmbedding", ["x", "c", "s", "p"], ["y"], name="rot")
    m = model([node], [vi("x", T.FLOAT, [1, 2, 3, 4]), vi("c", T.FLOAT, [5, 2]), vi("s", T.FLOAT, [5, 2]),
                       vi("p", T.INT64, [1, 3])], [vi("y", T.FLOAT, None)], opset=23)
    feeds = dict(x=rand(1, 2, 3, 4), c=rand(5, 2), s=rand(5, 2))
    _both_raise(m, dict(feeds, p=np.array([[0, 5, 1]])), r"RotaryEmbedding node 'rot'.*position_ids value 5")
    _both_raise(m, dict(feeds, p=np.array([[0, -1, 1]])), r"position_ids value -1")


def test_rotary_cache_must_cover_batch_and_sequence():
    node = h.make_node("RotaryEmbedding", ["x", "c", "s"], ["y"], name="rot")
    m = model([node], [vi("x", T.FLOAT, [2, 2, 3, 4]), vi("c", T.FLOAT, [1, 3, 2]), vi("s", T.FLOAT, [1, 3, 2])],
              [vi("y", T.FLOAT, None)], opset=23)
    with pytest.raises(KilnError, match="RotaryEmbedding node 'rot'.*cos_cache"):
        kiln.compile(m, target="cpu")


@pytest.mark.parametrize("ignore", [None, -100])
def test_nll_target_out_of_range_raises(ignore):
    attrs = {} if ignore is None else {"ignore_index": ignore}
    m = model([h.make_node("NegativeLogLikelihoodLoss", ["x", "t"], ["y"], name="nll", **attrs)],
              [vi("x", T.FLOAT, [3, 4]), vi("t", T.INT64, [3])], [vi("y", T.FLOAT, None)], opset=13)
    _both_raise(m, dict(x=rand(3, 4), t=np.array([0, 4, 1])), r"NegativeLogLikelihoodLoss node 'nll'.*\b4\b")
    if ignore is not None:   # the ignored class is not an error
        y = kiln.compile(m, target="cpu").run(x=(x := rand(3, 4)), t=np.array([0, ignore, 1]))["y"]
        np.testing.assert_allclose(y, -(x[0, 0] + x[2, 1]) / 2, rtol=1e-5)


def test_nll_target_shape_must_fit_input():
    m = model([h.make_node("NegativeLogLikelihoodLoss", ["x", "t"], ["y"], name="nll")],
              [vi("x", T.FLOAT, [3, 4, 2]), vi("t", T.INT64, [3, 5])], [vi("y", T.FLOAT, None)], opset=13)
    with pytest.raises(KilnError, match="target must have shape"):
        kiln.compile(m, target="cpu")


def test_roi_align_bad_batch_index_and_nan_roi_raise():
    m = model([h.make_node("RoiAlign", ["x", "r", "b"], ["y"], name="roi", output_height=2, output_width=2)],
              [vi("x", T.FLOAT, [2, 1, 6, 6]), vi("r", T.FLOAT, [2, 4]), vi("b", T.INT64, [2])],
              [vi("y", T.FLOAT, None)], opset=16)
    rois = np.array([[0, 0, 3, 3], [1, 1, 4, 5]], np.float32)
    feeds = dict(x=rand(2, 1, 6, 6), r=rois)
    _both_raise(m, dict(feeds, b=np.array([0, 2])), r"RoiAlign node 'roi'.*batch_indices value 2")
    _both_raise(m, dict(feeds, b=np.array([0, -1])), r"batch_indices value -1")
    for bad in (np.nan, np.inf, 1e30):
        r = rois.copy()
        r[1, 2] = bad
        _both_raise(m, dict(feeds, r=r, b=np.array([0, 1])), r"RoiAlign node 'roi'.*roi 1 is too large or not finite")


def test_max_unpool_index_out_of_range_raises():
    m = model([h.make_node("MaxUnpool", ["x", "i"], ["y"], name="up", kernel_shape=[2, 2], strides=[2, 2])],
              [vi("x", T.FLOAT, [1, 1, 2, 2]), vi("i", T.INT64, [1, 1, 2, 2])], [vi("y", T.FLOAT, None)])
    c = kiln.compile(m, target="cpu")
    with pytest.raises(KilnError, match=r"MaxUnpool node 'up'.*index 16 is out of range"):
        c.run(x=rand(1, 1, 2, 2), i=np.array([[[[0, 3], [8, 16]]]]))


def test_cumsum_runtime_axis_out_of_range_raises():
    m = model([h.make_node("CumSum", ["x", "a"], ["y"], name="cs")], [vi("x", T.FLOAT, [2, 3]), vi("a", T.INT64, [])],
              [vi("y", T.FLOAT, None)], opset=14)
    c = kiln.compile(m, target="cpu")
    with pytest.raises(KilnError, match=r"CumSum node 'cs'.*axis -3 is out of range \[-2, 1\]"):
        c.run(x=rand(2, 3), a=np.array(-3))
    x = rand(2, 3)
    np.testing.assert_allclose(c.run(x=x, a=np.array(-1))["y"], np.cumsum(x, axis=1), rtol=1e-6)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_non_finite_roi_stays_in_bounds(mode):
    """A NaN / infinite / huge roi gives NaN or extrapolated values, never an index cast from NaN."""
    for bad in (np.nan, np.inf, -1e30):
        roi = numpy_helper.from_array(np.array([0, 0, bad, 0, 1, 1, 1, 1], np.float32), "roi")
        sizes = numpy_helper.from_array(np.array([1, 1, 4, 4], np.int64), "sizes")
        m = model([h.make_node("Resize", ["x", "roi", "", "sizes"], ["y"], mode=mode,
                               coordinate_transformation_mode="tf_crop_and_resize")],
                  [vi("x", T.FLOAT, [1, 1, 3, 3])], [vi("y", T.FLOAT, None)], inits=[roi, sizes], opset=19)
        x = rand(1, 1, 3, 3)
        got = kiln.compile(m, target="cpu").run(x=x)["y"]
        want = kiln.compile(m, target="interpreter").run(x=x)["y"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# ---- the status path: which call failed, through the entry and through an artifact ----

def _two_gathers():
    nodes = [h.make_node("Relu", ["x"], ["r"], name="relu"), h.make_node("Gather", ["r", "i"], ["g"], name="g1"),
             h.make_node("Gather", ["g", "j"], ["y"], name="g2", axis=1)]
    return model(nodes, [vi("x", T.FLOAT, [4, 5]), vi("i", T.INT64, [3]), vi("j", T.INT64, [2])],
                 [vi("y", T.FLOAT, [3, 2])])


def test_the_error_names_the_failing_node_among_several():
    c = kiln.compile(_two_gathers(), target="cpu")
    x = rand(4, 5)
    with pytest.raises(KilnError, match=r"Gather node 'g2'.*index 5 is out of range \[-5, 4\] for axis 1"):
        c.run(x=x, i=np.array([0, 1, 3]), j=np.array([0, 5]))
    with pytest.raises(KilnError, match=r"Gather node 'g1'.*index -5 is out of range \[-4, 3\]"):
        c.run(x=x, i=np.array([0, -5, 3]), j=np.array([0, 1]))
    y = c.run(x=x, i=np.array([0, 1, 3]), j=np.array([4, -5]))["y"]
    np.testing.assert_array_equal(y, np.maximum(x, 0)[[0, 1, 3]][:, [4, 0]])


def test_a_saved_artifact_raises_the_same_error(tmp_path):
    c = kiln.compile(_two_gathers(), target="cpu")
    path = tmp_path / "g.kiln"
    kiln.save(c, path)
    loaded = kiln.load(path)
    with pytest.raises(KilnError, match=r"Gather node 'g2'.*index 7 is out of range"):
        loaded.run(x=rand(4, 5), i=np.array([0, 1, 3]), j=np.array([0, 7]))


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
def test_grid_sample_non_finite_grid_is_defined(mode):
    """NaN / huge sampling coordinates are clamped before the cast to an index (casting them
    is undefined behaviour in C; -fsanitize=float-cast-overflow reported it)."""
    m = model([h.make_node("GridSample", ["x", "g"], ["y"], mode=mode)],
              [vi("x", T.FLOAT, [1, 1, 4, 4]), vi("g", T.FLOAT, [1, 2, 2, 2])], [vi("y", T.FLOAT, None)], opset=20)
    g = np.array([np.nan, 0.5, 1e30, -1e30, -np.inf, np.inf, 0.2, 0.1], np.float32).reshape(1, 2, 2, 2)
    x = rand(1, 1, 4, 4)
    got = kiln.compile(m, target="cpu").run(x=x, g=g)["y"]
    want = kiln.compile(m, target="interpreter").run(x=x, g=g)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
