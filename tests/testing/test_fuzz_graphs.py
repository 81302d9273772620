"""The fuzzer's generator: deterministic, valid by onnx's checker and the reference, and
covering the program shapes the fuzzer promises (anchors, epilogues, views, fan-out, outputs,
symbolic dims, dtypes, opsets)."""

from collections import Counter

import numpy as np
import onnx
import pytest

import kiln
from kiln.testing.fuzz_builder import LEVELS, levels_for
from kiln.testing.fuzz_elementwise import UNARY
from kiln.testing.fuzz_graphs import generate

SEEDS = range(400)


@pytest.fixture(scope="module")
def cases():
    return [generate(s) for s in SEEDS]


def test_same_seed_same_case():
    a, b = generate(7), generate(7)
    assert a.model.SerializeToString() == b.model.SerializeToString()
    assert a.feeds.keys() == b.feeds.keys()
    for k in a.feeds:
        np.testing.assert_array_equal(a.feeds[k], b.feeds[k])
    assert generate(8).model.SerializeToString() != a.model.SerializeToString()


@pytest.mark.parametrize("seed", range(0, 120, 3))
def test_valid_models(seed):
    case = generate(seed)
    # a declared dim of -1 (old exporters' "any size", which kiln accepts) trips onnx's own
    # shape inference: those graphs get the structural check only
    minus_one = any(d.dim_value < 0 for i in case.model.graph.input for d in i.type.tensor_type.shape.dim)
    onnx.checker.check_model(case.model, full_check=not minus_one)
    outs = kiln.compile(case.model, target="interpreter", opt_level=0).run(case.feeds)
    assert len(outs) == len(case.model.graph.output)
    for name, x in outs.items():   # guarded domains: the reference sees no NaN
        if np.asarray(x).dtype.kind == "f":
            assert not np.isnan(x).any(), (seed, name)


def test_levels_rotate_over_all():
    for per in (1, 2, 3):
        seen = set()
        for s in range(8):
            lv = levels_for(s, per)
            assert len(lv) == per
            seen |= set(lv)
        assert seen == set(LEVELS)
    assert levels_for(5, 4) == LEVELS


def test_coverage(cases):
    ops = Counter(op for c in cases for op in set(c.ops))
    anchors = {"Conv", "ConvTranspose", "MatMul", "Gemm", "MaxPool", "AveragePool", "GlobalAveragePool",
               "Resize", "Gather", "ReduceSum", "ReduceMean", "ArgMax", "Softmax", "LayerNormalization",
               "BatchNormalization", "InstanceNormalization"}
    views = {"Reshape", "Transpose", "Slice", "Expand", "Concat", "Split", "Squeeze", "Unsqueeze",
             "Flatten", "Pad", "Tile"}
    elementwise = set(UNARY) | {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "PRelu", "Clip", "Cast",
                                "Where", "Greater", "Not"}
    other = {"If", "NonZero", "GatherND", "Compress", "TopK", "Shape", "Dropout", "Erf"}
    missing = sorted((anchors | views | elementwise | other) - set(ops))
    assert not missing, f"never generated in {len(cases)} graphs: {missing}"


def _attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def test_conv_kinds(cases):
    kinds = Counter()
    for c in cases:
        inits = {t.name: t for t in c.model.graph.initializer}
        for n in c.model.graph.node:
            if n.op_type != "Conv":
                continue
            w = inits[n.input[1]]
            nd = len(w.dims) - 2
            kinds[f"{nd}d"] += 1
            group = _attr(n, "group", 1)
            if group > 1:
                kinds["depthwise" if w.dims[1] == 1 else "grouped"] += 1
            kinds["strided"] += any(s > 1 for s in _attr(n, "strides", [1]))
            kinds["dilated"] += any(d > 1 for d in _attr(n, "dilations", [1]))
            kinds["padded"] += any(_attr(n, "pads", [0])) or _attr(n, "auto_pad", b"NOTSET") != b"NOTSET"
            kinds["bias"] += len(n.input) > 2
            kinds["no bias"] += len(n.input) == 2
    for k in ("1d", "2d", "3d", "grouped", "depthwise", "strided", "dilated", "padded", "bias", "no bias"):
        assert kinds[k] > 0, (k, kinds)


def test_graph_shapes(cases):
    symbolic = sum(any(d.dim_param for i in c.model.graph.input for d in i.type.tensor_type.shape.dim)
                   for c in cases)
    multi_out = sum(len(c.model.graph.output) > 1 for c in cases)
    dtypes = {i.type.tensor_type.elem_type for c in cases for i in c.model.graph.input}
    opsets = {c.model.opset_import[0].version for c in cases}
    ones = sum(1 in x.shape for c in cases for x in c.feeds.values())
    assert symbolic > 20 and multi_out > 20 and ones > 20
    assert {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16} <= dtypes
    assert len(opsets) >= 8
    # fan-out: some value read by two or more nodes (or a node and a graph output)
    fan = 0
    for c in cases:
        reads = Counter(i for n in c.model.graph.node for i in set(n.input) if i)
        reads.update(o.name for o in c.model.graph.output)
        fan += any(v >= 2 for k, v in reads.items() if not k.startswith(("c", "i", "w", "bias")))
    assert fan > 50
