"""The model corpus's torch definitions (benchmarks/corpus) through both torch entry points,
at each model's trace shape, against eager (rtol 1e-3, atol 1e-4) on inputs other than the
ones traced with. Slow: full-size models (test_corpus_small.py has them at small widths)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import kiln  # noqa: E402
from benchmarks.corpus import specs  # noqa: E402
from benchmarks.corpus.spec import concrete  # noqa: E402
from tests.frontends.torch.test_models import assert_matches  # noqa: E402

SPECS = {s.name: s for s in specs()}


def build(spec, seed=1):
    torch.manual_seed(0)
    m = spec.make().eval()
    g = torch.Generator().manual_seed(seed)
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
    m, example = build(SPECS[name])
    _, xs = build(SPECS[name], seed=2)
    with torch.no_grad():
        want = m(*xs)
        if entry == "export":
            got = kiln.compile(m, example_inputs=example)(*xs)
        else:
            cm = torch.compile(m, backend="kiln")
            cm(*example)
            got = cm(*xs)
    assert_matches(got, want)
