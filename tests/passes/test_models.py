"""The benchmark models at -O3: what the passes find in them, and the same numbers as -O0."""

import collections
import functools

import numpy as np
import pytest

from benchmarks.models import MODELS, inputs_for
from kiln.frontends.onnx import load_onnx
from kiln.interpreter import Interpreter
from kiln.passes import AttentionGroup, run_passes
from kiln.passes.merge_gemms import MergedGemms


@functools.lru_cache(maxsize=None)
def optimized(name: str):
    model = MODELS[name]()
    g = load_onnx(model)
    out, stats = run_passes(g, 3, verify=True)
    return model, g, out, stats


def _ops(g):
    return collections.Counter(n.op for n in g.nodes)


def _fired(stats, pass_name):
    return next(s.fired for s in stats if s.name == pass_name)


def test_resnet18_has_no_batchnorm_left():
    _, g, out, stats = optimized("resnet18")
    assert _ops(g)["BatchNormalization"] == 20
    assert _ops(out)["BatchNormalization"] == 0 and _ops(out)["Conv"] + _ops(out)["ConvNCHWc"] + _ops(out)["ConvWinograd"] == 20
    assert _fired(stats, "fold_batchnorm") == {"Conv+BN": 20}


def test_bert_encoder_layernorm_gelu_attention():
    _, g, out, stats = optimized("bert_encoder")
    ops = _ops(out)
    assert ops["LayerNormalization"] == 13   # embeddings + 2 per layer, 6 layers
    assert ops["Gelu"] == 6
    assert not {"ReduceMean", "Pow", "Sqrt", "Erf", "Div", "Identity"} & set(ops)
    attention = [f for s in stats for f in s.findings if isinstance(f, AttentionGroup)]
    assert len(attention) == 6 and all(a.mask == "additive" for a in attention)
    assert all(abs(a.scale - 1 / np.sqrt(32)) < 1e-6 for a in attention)
    merged = [f for s in stats for f in s.findings if isinstance(f, MergedGemms)]
    assert len(merged) == 6 and all(len(f.nodes) == 3 for f in merged)   # Q, K and V of each layer


def test_gpt2_decoder_tanh_gelu_and_causal_attention():
    _, g, out, stats = optimized("gpt2_decoder")
    assert _ops(out)["Gelu"] == 4 and _ops(out)["Tanh"] == 0
    attention = [f for s in stats for f in s.findings if isinstance(f, AttentionGroup)]
    assert len(attention) == 4 and all(a.mask == "where" for a in attention)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_o3_gives_the_numbers_of_o0(name):
    model, g, out, _ = optimized(name)
    feeds = inputs_for(name, model)
    xs = [feeds[v.name] for v in g.inputs]
    for a, b in zip(Interpreter(g).run(xs), Interpreter(out).run(xs)):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4)
