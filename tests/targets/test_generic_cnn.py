"""shapes="generic" for convolutional networks (issue 15 item 1): a CNN with a symbolic
batch, and one with a symbolic image size too, runs every value from one compiled module,
matching the NumPy reference, and a new shape runs no C compiler. The conv plans do not
depend on the batch's value (images are an outer loop; tiles are planned for one image);
image sizes pass through the windows' floor divisions (kiln.lower.symbolic_shapes)."""

import numpy as np
import onnx
import pytest
from onnx import helper
from onnx import numpy_helper as nh

from tests.targets.test_generic_shapes import _check_runs, _generic, compiler_runs  # noqa: F401 (fixture)

F = onnx.TensorProto.FLOAT


def cnn(batch="N", height=20, width=24, opset=17):
    """conv+bias+relu, conv + residual add, strided max pool, strided conv, 1x1 convs, nearest
    Resize x2, Concat along channels, global average pool + flatten (two outputs)."""
    rng = np.random.default_rng(0)

    def w(name, *shape):
        return nh.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)
    inits = [w("w1", 16, 3, 3, 3), w("b1", 16), w("w2", 16, 16, 3, 3), w("w3", 32, 16, 3, 3), w("b3", 32),
             w("w4", 32, 32, 1, 1), w("w5", 16, 32, 1, 1), w("w6", 8, 16, 3, 3),
             nh.from_array(np.array([1, 1, 2, 2], np.float32), "scales"), nh.from_array(np.zeros(0, np.float32), "roi")]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Add", ["c2", "r1"], ["res"], name="residual"),
        helper.make_node("MaxPool", ["res"], ["p2"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                         name="pool"),
        helper.make_node("Conv", ["p2", "w3", "b3"], ["c3"], pads=[1, 1, 1, 1], strides=[2, 2], name="conv3_s2"),
        helper.make_node("Relu", ["c3"], ["r3"], name="relu3"),
        helper.make_node("Conv", ["r3", "w4"], ["c4"], name="conv4_1x1"),
        helper.make_node("Conv", ["c4", "w5"], ["c5"], name="conv5_1x1"),
        helper.make_node("Resize", ["c5", "roi", "scales"], ["up"], mode="nearest", name="upsample"),
        helper.make_node("Conv", ["up", "w6"], ["side"], pads=[1, 1, 1, 1], name="side"),
        helper.make_node("Concat", ["up", "side"], ["cat"], axis=1, name="concat"),
        helper.make_node("GlobalAveragePool", ["c4"], ["gp"], name="gap"),
        helper.make_node("Flatten", ["gp"], ["emb"], name="flatten"),
    ]
    g = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", F, [batch, 3, height, width])],
                          [helper.make_tensor_value_info("emb", F, [batch, 32]),
                           helper.make_tensor_value_info("cat", F, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


BATCHES = (1, 2, 3, 5, 7, 13, 32)


@pytest.mark.parametrize("level", [2, 3])
def test_cnn_runs_every_batch_from_one_module(level, compiler_runs):  # noqa: F811
    """-O2 (plain NCHW convs) and -O3 (the blocked NCHWc layout): batches 1, primes and 32."""
    m = _generic(cnn(), opt_level=level)
    rng = np.random.default_rng(level)
    _check_runs(m, [{"x": rng.standard_normal((b, 3, 20, 24)).astype(np.float32)} for b in BATCHES],
                compiler_runs, rtol=1e-4, atol=1e-4)
    assert m.specializations == 1
    if level == 3:     # the algorithms the layout pass chose run on the symbolic batch too
        calls = " ".join(m.module.info["calls"])
        assert "ConvWinograd" in calls and "ConvNCHWc" in calls and "MaxPoolNCHWc" in calls, calls
        # each conv's algorithm is reported, chosen per image (for every batch)
        assert "conv 'conv2' [3x3 16->16 out N(per image)x20x24]: winograd" in str(m.report), m.report


# (batch, height, width): 1, primes, odd and even (the strided windows' floor divisions), large
IMAGES = [(1, 1, 1), (1, 2, 2), (2, 3, 5), (1, 7, 13), (3, 17, 2), (1, 20, 24), (2, 31, 64), (1, 97, 101),
          (1, 224, 224)]


@pytest.mark.parametrize("level", [2, 3])
def test_cnn_runs_every_image_size_from_one_module(level, compiler_runs):  # noqa: F811
    m = _generic(cnn(height="H", width="W"), opt_level=level)
    rng = np.random.default_rng(10 + level)
    _check_runs(m, [{"x": rng.standard_normal((n, 3, h, w)).astype(np.float32)} for n, h, w in IMAGES],
                compiler_runs, rtol=1e-4, atol=1e-4)
    assert m.specializations == 1


def test_image_sizes_are_floor_divisions_of_the_symbols():
    """The stride-2 pool's and conv's output sizes are named by floor divisions of H and W."""
    from kiln.frontends.onnx import load_onnx
    from kiln.lower.symbolic_shapes import Poly, resolve
    res = resolve(load_onnx(cnn(height="H", width="W")), ["N", "H", "W"])
    shapes = {n.name: n.outputs[0].type.shape for n in res.graph.nodes}
    assert shapes["pool"] == ("N", 16, "(H+1)//2", "(W+1)//2")
    assert shapes["conv3_s2"] == ("N", 32, "((H+1)//2+1)//2", "((W+1)//2+1)//2")
    up = res.poly(shapes["upsample"][2])
    for h in (1, 2, 3, 4, 5, 17, 224):
        pooled = (h + 2 - 3) // 2 + 1
        assert up.evaluate({"N": 1, "H": h, "W": 1}) == 2 * ((pooled + 2 - 3) // 2 + 1)
    assert (Poly.sym("H") * 2 + 5).floordiv(2) == Poly.sym("H") + 2      # exact terms come out
    assert up.lower_bound() == 2


def test_windows_over_a_symbolic_image_size(compiler_runs):  # noqa: F811
    """Average pools (pads counted or not), a depthwise and a dilated conv, a 1-D strided
    conv, and nearest Resize down (0.5: floor(H / 2)) and up in asymmetric mode, over H, W."""
    rng = np.random.default_rng(3)

    def w(name, *shape):
        return nh.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)
    inits = [w("dw", 8, 1, 3, 3), w("wd", 8, 8, 3, 3), w("w1d", 4, 8, 5),
             nh.from_array(np.array([1, 1, 0.5, 0.5], np.float32), "half"),
             nh.from_array(np.array([1, 1, 3, 2], np.float32), "up"), nh.from_array(np.zeros(0, np.float32), "roi"),
             nh.from_array(np.array([0, 8, -1], np.int64), "to1d")]
    nodes = [
        helper.make_node("AveragePool", ["x"], ["a1"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("AveragePool", ["x"], ["a2"], kernel_shape=[2, 3], strides=[2, 1], pads=[0, 1, 1, 0],
                         count_include_pad=1),
        helper.make_node("Conv", ["x", "dw"], ["d1"], group=8, pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Conv", ["x", "wd"], ["d2"], dilations=[2, 2], pads=[2, 2, 2, 2]),
        helper.make_node("Reshape", ["x", "to1d"], ["flat"]),
        helper.make_node("Conv", ["flat", "w1d"], ["c1d"], strides=[3], pads=[2, 2]),
        helper.make_node("Resize", ["x", "roi", "half"], ["down"], mode="nearest"),
        helper.make_node("Resize", ["x", "roi", "up"], ["upa"], mode="nearest",
                         coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
    ]
    outs = ["a1", "a2", "d1", "d2", "c1d", "down", "upa"]
    g = helper.make_graph(nodes, "windows", [helper.make_tensor_value_info("x", F, ["N", 8, "H", "W"])],
                          [helper.make_tensor_value_info(o, F, None) for o in outs], inits)
    m = _generic(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), opt_level=2)
    feeds = [{"x": rng.standard_normal((n, 8, h, w_)).astype(np.float32)}
             for n, h, w_ in [(1, 2, 2), (2, 3, 7), (1, 13, 5), (1, 32, 33), (3, 61, 2)]]
    _check_runs(m, feeds, compiler_runs, rtol=1e-4, atol=1e-4)
