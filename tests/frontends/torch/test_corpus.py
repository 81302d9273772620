"""The model corpus's torch definitions (benchmarks/corpus) through both torch entry points,
at each model's trace shape, against eager (rtol 1e-3, atol 1e-4). Slow: full-size models."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import kiln  # noqa: E402
from benchmarks.corpus import specs  # noqa: E402
from benchmarks.corpus.spec import concrete  # noqa: E402
from tests.frontends.torch.test_models import assert_matches  # noqa: E402

SPECS = {s.name: s for s in specs()}


def build(spec):
    torch.manual_seed(0)
    m = spec.make().eval()
    g = torch.Generator().manual_seed(1)
    xs = []
    for i in spec.inputs:
        shape = concrete(i.shape, spec.trace)
        if i.dtype == "float32":
            xs.append(torch.randn(shape, generator=g))
        else:
            xs.append(torch.randint(i.low, max(i.high, i.low + 1), shape, generator=g,
                                    dtype=getattr(torch, i.dtype)))
    return m, tuple(xs)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("entry", ["export", "dynamo"])
def test_corpus_model(name, entry, monkeypatch):
    monkeypatch.setattr(torch._dynamo.config, "allow_rnn", True)
    m, xs = build(SPECS[name])
    with torch.no_grad():
        want = m(*xs)
        if entry == "export":
            got = kiln.compile(m, example_inputs=xs)(*xs)
        else:
            got = torch.compile(m, backend="kiln")(*xs)
    assert_matches(got, want)
