"""Whole torch models through both entry points, against eager (rtol 1e-3, atol 1e-4)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import kiln  # noqa: E402
from tests.frontends.torch.zoo import MODELS  # noqa: E402

FAST = {"mlp", "gpt", "encoder_layer"}
HF = {"bert_hf", "gpt2_hf", "llama_hf"}


def leaves(x):
    return torch.utils._pytree.tree_leaves(x)


def assert_matches(got, want):
    assert type(got) is type(want) or isinstance(want, dict) and isinstance(got, dict)
    if isinstance(want, dict):
        assert list(got) == list(want)
    g, w = leaves(got), leaves(want)
    assert len(g) == len(w)
    for a, b in zip(g, w):
        assert isinstance(a, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


def build(name):
    if name in HF:
        pytest.importorskip("transformers")
    torch.manual_seed(0)
    m, ins = MODELS[name]()
    return m.eval(), ins


def fresh_inputs(ins, seed=1):
    """Inputs like the examples but with new random data (ids stay in range)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for x in ins:
        if x.dtype.is_floating_point:
            out.append(torch.randn(x.shape, generator=g, dtype=x.dtype))
        elif x.numel() and int(x.max()) > 1:
            out.append(torch.randint(0, int(x.max()) + 1, x.shape, generator=g, dtype=x.dtype))
        else:
            out.append(x.clone())
    return tuple(out)


PARAMS = [pytest.param(n, marks=() if n in FAST else pytest.mark.slow) for n in MODELS]


def export_matches(m, example, fresh):
    """kiln.compile(m) traced on `example` gives eager's outputs on `fresh`."""
    cm = kiln.compile(m, example_inputs=example)
    with torch.no_grad():
        want = m(*fresh)
    assert_matches(cm(*fresh), want)


def dynamo_matches(m, example, fresh):
    """torch.compile(m, backend='kiln') called on `example`, then on `fresh`, gives eager's outputs."""
    cm = torch.compile(m, backend="kiln")
    with torch.no_grad():
        cm(*example)
        got = cm(*fresh)
        want = m(*fresh)
    assert_matches(got, want)


@pytest.mark.parametrize("name", PARAMS)
def test_export_entry_point(name):
    m, ins = build(name)
    export_matches(m, ins, fresh_inputs(ins))


@pytest.mark.parametrize("name", PARAMS)
def test_dynamo_entry_point(name, monkeypatch):
    monkeypatch.setattr(torch._dynamo.config, "allow_rnn", True)  # else nn.LSTM is a graph break
    m, ins = build(name)
    dynamo_matches(m, ins, fresh_inputs(ins))
