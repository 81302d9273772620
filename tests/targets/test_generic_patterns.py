"""shapes="generic" for the patterns that made detection, segmentation, OCR, audio and
recurrent models specialise per shape (issue 15 item 1): each runs at several values of
its symbols (1, primes, large) from one compiled module, matching the NumPy reference,
with no C compiler run after the compile.

- heads flattened and concatenated along a computed size (YOLO's detections);
- DepthToSpace upsampling concatenated with, or a 2x Resize added to, the skip connection
  (U-Net, FPN): the two sizes, 2 * floor(H / 2) and H, are equal only for even H, so the
  module serves those under a guard and runs the others specialised (where the reference
  refuses them);
- Resize to the run-time size of another tensor (F.interpolate(x, size=y.shape[2:]));
- LSTM and GRU over a symbolic sequence and batch (kiln::Recurrent's tiles picked at run time);
- a Slice to -1 and a Reshape to -1 of a size that is a floor division minus one (wav2vec2's
  positional conv padding and its attention heads).
"""

import numpy as np
import onnx
import pytest
from onnx import helper
from onnx import numpy_helper as nh

import kiln
from tests.targets.test_generic_shapes import _check_runs, _generic, compiler_runs  # noqa: F401 (fixture)

F = onnx.TensorProto.FLOAT


def _w(rng, name, *shape, scale=0.3):
    return nh.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def _ints(name, *values):
    return nh.from_array(np.array(values, np.int64), name)


def _graph(nodes, inputs, outputs, inits, opset=17):
    g = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(o, F, None) for o in outputs], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _images(rng, channels, sizes):
    return [{"x": rng.standard_normal((n, channels, h, w)).astype(np.float32)} for n, h, w in sizes]


def test_heads_concatenated_along_a_computed_size(compiler_runs):  # noqa: F811
    """[N, 4, H*W] and [N, 4, H2*W2] (H2 = floor((H - 1) / 2) + 1) concatenated: the axis's
    size is their sum, a polynomial of the symbols."""
    rng = np.random.default_rng(0)
    inits = [_w(rng, "w1", 4, 3, 1, 1), _w(rng, "w2", 4, 3, 3, 3), _ints("flat", 0, 4, -1)]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"]),
             helper.make_node("Conv", ["x", "w2"], ["b"], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["a", "flat"], ["fa"]),
             helper.make_node("Reshape", ["b", "flat"], ["fb"]),
             helper.make_node("Concat", ["fa", "fb"], ["y"], axis=2),
             helper.make_node("Sigmoid", ["y"], ["s"])]
    m = _generic(_graph(nodes, [helper.make_tensor_value_info("x", F, ["N", 3, "H", "W"])], ["s"], inits))
    _check_runs(m, _images(rng, 3, [(1, 1, 1), (2, 7, 13), (1, 64, 96), (3, 31, 2)]), compiler_runs,
                rtol=1e-4, atol=1e-5)


def _skip_model(up: str):
    """x -> 2x2 max pool -> 1x1 conv -> 2x upsampling (DepthToSpace, or Resize by scales)
    -> joined with x (Concat on channels, or Add)."""
    rng = np.random.default_rng(1)
    inits = [_w(rng, "w", 32 if up == "d2s" else 8, 8, 1, 1),
             nh.from_array(np.array([1, 1, 2, 2], np.float32), "scales"), nh.from_array(np.zeros(0, np.float32), "roi")]
    nodes = [helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p", "w"], ["c"])]
    if up == "d2s":
        nodes += [helper.make_node("DepthToSpace", ["c"], ["u"], blocksize=2, mode="CRD"),
                  helper.make_node("Concat", ["u", "x"], ["y"], axis=1)]
    else:
        nodes += [helper.make_node("Resize", ["c", "roi", "scales"], ["u"], mode="nearest"),
                  helper.make_node("Add", ["u", "x"], ["y"])]
    return _graph(nodes, [helper.make_tensor_value_info("x", F, ["N", 8, "H", "W"])], ["y"], inits)


@pytest.mark.parametrize("up", ["d2s", "resize"])
def test_upsampled_joined_with_its_skip_connection(up, compiler_runs):  # noqa: F811
    m = _generic(_skip_model(up))
    rng = np.random.default_rng(2)
    _check_runs(m, _images(rng, 8, [(1, 2, 2), (2, 2 * 7, 2 * 13), (1, 128, 96), (3, 62, 4)]), compiler_runs,
                rtol=1e-4, atol=1e-5)
    assert m.specializations == 1


def test_an_odd_size_the_skip_connection_refuses_is_a_clear_error():
    """At H = 7 the upsampled tensor has 6 rows against the skip's 7: outside the guard, the
    shape runs specialised, whose inference refuses it with a KilnError (never a wrong answer)."""
    m = _generic(_skip_model("resize"))
    with pytest.raises(kiln.KilnError):
        m.run({"x": np.ones((1, 8, 7, 8), np.float32)})


def test_resize_to_the_run_time_size_of_another_tensor(compiler_runs):  # noqa: F811
    """A stride-2 conv's output resized back to x's size (sizes = Shape(y)[:2] ++ Shape(x)[2:]),
    then added to x: any H, W, odd ones included (nearest, asymmetric, floor)."""
    rng = np.random.default_rng(3)
    inits = [_w(rng, "w", 6, 6, 3, 3), _ints("zero", 0), _ints("two", 2), _ints("big", 2 ** 62)]
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Shape", ["y"], ["sy"]), helper.make_node("Shape", ["x"], ["sx"]),
             helper.make_node("Slice", ["sy", "zero", "two"], ["nc"]),
             helper.make_node("Slice", ["sx", "two", "big"], ["hw"]),
             helper.make_node("Concat", ["nc", "hw"], ["sizes"], axis=0),
             helper.make_node("Resize", ["y", "", "", "sizes"], ["u"], mode="nearest",
                              coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
             helper.make_node("Add", ["u", "x"], ["z"])]
    m = _generic(_graph(nodes, [helper.make_tensor_value_info("x", F, ["N", 6, "H", "W"])], ["z"], inits))
    _check_runs(m, _images(rng, 6, [(1, 1, 1), (2, 7, 13), (1, 97, 64), (1, 2, 3)]), compiler_runs,
                rtol=1e-4, atol=1e-5)


# LSTM reverse alone is slow only: the bidirectional case runs a reverse direction too
@pytest.mark.parametrize("kind,direction", [("LSTM", "bidirectional"), ("GRU", "forward"),
                                            pytest.param("LSTM", "reverse", marks=pytest.mark.slow)])
def test_recurrent_over_a_symbolic_sequence_and_batch(kind, direction, compiler_runs):  # noqa: F811
    """[seq, batch, 12] through a 20-unit layer (constant weights: kiln::Recurrent), then a
    second layer on its output: sequence and batch 1, primes, large, from one module."""
    rng = np.random.default_rng(4)
    g, hs, nd = {"LSTM": 4, "GRU": 3}[kind], 20, 2 if direction == "bidirectional" else 1
    inits = [_w(rng, "W", nd, g * hs, 12), _w(rng, "R", nd, g * hs, hs), _w(rng, "B", nd, 2 * g * hs, scale=0.1),
             _w(rng, "W2", 1, g * hs, nd * hs), _w(rng, "R2", 1, g * hs, hs), _ints("merge", 0, 0, -1)]
    nodes = [helper.make_node(kind, ["x", "W", "R", "B"], ["y", "h"], hidden_size=hs, direction=direction),
             helper.make_node("Transpose", ["y"], ["yt"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["yt", "merge"], ["y3"]),
             helper.make_node(kind, ["y3", "W2", "R2"], ["y2", "h2"], hidden_size=hs)]
    m = _generic(_graph(nodes, [helper.make_tensor_value_info("x", F, ["seq", "batch", 12])], ["y2", "h", "h2"],
                        inits))
    assert "Recurrent" in " ".join(m.module.info["calls"])
    feeds = [{"x": rng.standard_normal((s, b, 12)).astype(np.float32)}
             for s, b in [(1, 1), (7, 3), (13, 1), (2, 9), (131, 2), (5, 17)]]
    _check_runs(m, feeds, compiler_runs, rtol=1e-4, atol=1e-5)


def test_slice_and_reshape_of_a_floor_division_minus_one(compiler_runs):  # noqa: F811
    """A strided 1-D conv (T = floor((n - 3) / 2) + 1), its last step sliced off (T - 1, a
    sum of terms), then [b, T - 1, 8] reshaped to [b, T - 1, -1, 4]: the -1 is 8 / 4 once
    the sizes both sides keep cancel."""
    rng = np.random.default_rng(5)
    inits = [_w(rng, "w", 8, 1, 3), _ints("s0", 0), _ints("e1", -1), _ints("ax", 2),
             _ints("heads", 0, 0, -1, 4), _ints("perm_shape", 0, 0, 8)]
    nodes = [helper.make_node("Unsqueeze", ["x", "one"], ["x3"]),
             helper.make_node("Conv", ["x3", "w"], ["c"], strides=[2]),
             helper.make_node("Slice", ["c", "s0", "e1", "ax"], ["cs"]),
             helper.make_node("Transpose", ["cs"], ["t"], perm=[0, 2, 1]),
             helper.make_node("Reshape", ["t", "heads"], ["h4"]),
             helper.make_node("Softmax", ["h4"], ["sm"], axis=-1),
             helper.make_node("Reshape", ["sm", "perm_shape"], ["y"])]
    inits.append(_ints("one", 1))
    m = _generic(_graph(nodes, [helper.make_tensor_value_info("x", F, ["b", "n"])], ["y"], inits))
    feeds = [{"x": rng.standard_normal((b, n)).astype(np.float32)} for b, n in [(1, 5), (2, 6), (3, 37), (1, 4001)]]
    _check_runs(m, feeds, compiler_runs, rtol=1e-4, atol=1e-5)


def test_a_symbol_of_one_runs_kernels_built_for_it(compiler_runs):  # noqa: F811
    """A GEMM over a symbolic batch is tiled for many rows (six per register tile): at batch 1
    five of them would be padding. Kernels whose code differs with the batch's hint at 1 are
    built that way too, and the entry picks them when the batch is 1 at run time; the report
    says so. Every batch matches the reference from the one module."""
    rng = np.random.default_rng(6)
    inits = [_w(rng, "w1", 64, 48), _w(rng, "b1", 48), _w(rng, "w2", 48, 10)]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y"])]
    m = _generic(_graph(nodes, [helper.make_tensor_value_info("x", F, ["N", 64])], ["y"], inits))
    assert any("N" in syms for syms in m.module.info["variants"].values()), m.module.info["variants"]
    assert "also built for N = 1" in str(m.report), m.report
    feeds = [{"x": rng.standard_normal((n, 64)).astype(np.float32)} for n in (1, 2, 7, 1, 64, 331)]
    _check_runs(m, feeds, compiler_runs, rtol=1e-4, atol=1e-5)


def test_kernels_built_for_one_follow_deduplicated_kernels(compiler_runs):  # noqa: F811
    """Repeated layers share one kernel; the next kernel then takes the index (and so the name)
    the repeat would have had: its variant for batch 1 must be its own, built once."""
    rng = np.random.default_rng(7)
    inits = [_w(rng, "w1", 64, 64), _w(rng, "w2", 64, 64), _w(rng, "w3", 64, 32)]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h1"]), helper.make_node("Relu", ["h1"], ["r1"]),
             helper.make_node("MatMul", ["r1", "w2"], ["h2"]), helper.make_node("Relu", ["h2"], ["r2"]),
             helper.make_node("MatMul", ["r2", "w3"], ["h3"]), helper.make_node("Relu", ["h3"], ["y"])]
    m = _generic(_graph(nodes, [helper.make_tensor_value_info("x", F, ["N", 64])], ["y"], inits))
    feeds = [{"x": rng.standard_normal((n, 64)).astype(np.float32)} for n in (1, 3, 1, 97)]
    _check_runs(m, feeds, compiler_runs, rtol=1e-4, atol=1e-5)
