"""The torch entry points' contracts: symbols, structure, errors, zero copy, Dynamo caching."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import kiln  # noqa: E402
from kiln.errors import KilnError  # noqa: E402
from kiln import dynamo  # noqa: E402
from kiln.frontends.torch import from_array, to_array  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]


class TwoOut(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)
        self.register_buffer("shift", torch.randn(4))

    def forward(self, x, y):
        h = self.lin(x) + self.shift
        return {"h": h, "pair": (h.sum(-1), y * 2)}


def test_dims_become_named_symbols_and_structure_is_kept():
    torch.manual_seed(0)
    m = TwoOut().eval()
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq", max=64)
    x, y = torch.randn(2, 5, 8), torch.randn(2, 3)
    cm = kiln.compile(m, example_inputs=(x, y),
                      dynamic_shapes={"x": {0: batch, 1: seq}, "y": {0: batch}})
    assert cm.inputs[0].shape == ("batch", "seq", 8)
    assert cm.inputs[1].shape == ("batch", 3)
    assert all(v.is_const for v in cm.graph.constants())  # weights and buffer: constants, not inputs
    assert len(cm.graph.inputs) == 2
    for b, s in [(2, 5), (3, 7), (1, 1)]:
        x, y = torch.randn(b, s, 8), torch.randn(b, 3)
        got = cm(x, y)
        want = m(x, y)
        assert set(got) == {"h", "pair"} and isinstance(got["pair"], tuple)
        torch.testing.assert_close(got["h"], want["h"], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(got["pair"][0], want["pair"][0], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(got["pair"][1], want["pair"][1])
    got = cm(x.numpy(), y.numpy())  # numpy in: numpy out, same structure
    assert isinstance(got["h"], np.ndarray)


def test_tensors_pass_without_copies():
    x = torch.randn(3, 4)
    a = to_array(x)
    assert np.shares_memory(a, x.numpy())
    arr = np.arange(6, dtype=np.float32)
    t = from_array(arr)
    assert t.data_ptr() == arr.ctypes.data


def test_bfloat16_tensors_pass_without_copies():
    x = torch.randn(3, 4, dtype=torch.bfloat16)
    a = to_array(x)
    assert a.dtype.name == "bfloat16" and a.ctypes.data == x.data_ptr()
    t = from_array(a)
    assert t.dtype == torch.bfloat16 and t.data_ptr() == x.data_ptr()
    assert torch.equal(t, x)


@pytest.mark.parametrize("entry", ["export", "dynamo"])
def test_bfloat16_module_and_inputs(entry):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                            torch.nn.Linear(32, 8)).eval().to(torch.bfloat16)
    x, fresh = torch.randn(2, 5, 16, dtype=torch.bfloat16), torch.randn(2, 5, 16, dtype=torch.bfloat16)
    with torch.no_grad():
        if entry == "export":
            cm = kiln.compile(m, example_inputs=(x,))
            assert cm.inputs[0].dtype == "bfloat16"
        else:
            cm = torch.compile(m, backend="kiln")
            cm(x)
        got, want = cm(fresh), m(fresh)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, rtol=1.6e-2, atol=1e-2)  # bfloat16's own precision


class Unsupported(torch.nn.Module):
    def forward(self, x):
        y = torch.lgamma(x)
        return torch.digamma(y) + torch.special.i0(x)


def test_every_untranslatable_op_is_listed_with_its_source_line():
    with pytest.raises(KilnError) as e:
        kiln.compile(Unsupported(), example_inputs=(torch.rand(3) + 1,))
    msg = str(e.value)
    assert "3 torch op(s)" in msg
    for op in ("aten.lgamma", "aten.digamma", "aten.special_i0"):
        assert op in msg or op.replace("special_", "") in msg
    assert "test_frontend.py" in msg and "torch.lgamma(x)" in msg


def test_needs_example_inputs():
    with pytest.raises(KilnError, match="example_inputs"):
        kiln.compile(TwoOut())


def test_entry_point_is_declared():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    ep = meta["project"]["entry-points"]["torch_dynamo_backends"]["kiln"]
    module, fn = ep.split(":")
    import importlib
    assert getattr(importlib.import_module(module), fn) is dynamo.kiln_backend
    from importlib.metadata import entry_points
    installed = [e for e in entry_points(group="torch_dynamo_backends") if e.name == "kiln"]
    if installed and installed[0].value != ep:
        # an editable install made before the backend moved to kiln.dynamo still names the old
        # place, which says how to refresh it (and kiln.dynamo.register() overrides it)
        with pytest.raises(AttributeError, match="reinstall kiln"):
            installed[0].load()
        pytest.skip(f"the installed kiln's entry point {installed[0].value} is out of date: pip install -e .")


class Recorder:
    """A Dynamo backend that hands each graph to kiln and keeps the KilnGraph objects."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        g = dynamo.kiln_backend(gm, example_inputs)
        self.graphs.append(g)
        return g


class Breaks(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(6, 6), torch.nn.Linear(6, 3)

    def forward(self, x):
        h = torch.relu(self.a(x))
        if h.sum() > 0:  # data-dependent branch: a graph break
            h = h * 2
        print(end="")  # another graph break
        return self.b(h).softmax(-1)


def test_graph_breaks_run_eager_between_kiln_graphs():
    torch.manual_seed(0)
    m = Breaks().eval()
    rec = Recorder()
    cm = torch.compile(m, backend=rec)
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(4, 6)
            torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-5)
    assert len(rec.graphs) >= 2
    assert all(g.compiles >= 1 for g in rec.graphs)


def test_dynamic_shapes_no_recompile_on_return():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 2)).eval()
    rec = Recorder()
    cm = torch.compile(m, backend=rec, dynamic=True)
    with torch.no_grad():
        for n in (3, 5, 3, 5):
            x = torch.randn(n, 8)
            torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-5)
    assert len(rec.graphs) == 1  # Dynamo compiled once (symbolic batch)
    assert rec.graphs[0].compiles == 1  # kiln: once, with a symbolic batch


@pytest.mark.parametrize("how", ["dynamic", "mark_dynamic", "automatic"])
def test_symbolic_batch_and_sequence_compile_once(how):
    """Dynamo's symbolic dims stay kiln symbols: one kiln compile serves every size."""
    from tests.frontends.torch.zoo import MODELS
    torch.manual_seed(0)
    m, _ = MODELS["gpt"]()
    m.eval()
    rec = Recorder()
    cm = torch.compile(m, backend=rec, dynamic=True if how == "dynamic" else None)
    sizes = [(2, 5), (3, 9), (2, 12), (4, 7), (2, 5)]
    with torch.no_grad():
        for b, s in sizes:
            ids = torch.randint(0, 100, (b, s))
            if how == "mark_dynamic":
                torch._dynamo.mark_dynamic(ids, 0)
                torch._dynamo.mark_dynamic(ids, 1)
            torch.testing.assert_close(cm(ids), m(ids), rtol=1e-3, atol=1e-4)
    # automatic dynamic: Dynamo's first graph is static, its second symbolic (Dynamo's recompile)
    assert len(rec.graphs) == (2 if how == "automatic" else 1)
    assert [g.compiles for g in rec.graphs] == [1] * len(rec.graphs)
    shape = rec.graphs[-1].entries[0][1].inputs[0].shape
    assert all(isinstance(d, str) for d in shape), shape


def test_size_inputs_are_read_from_shapes():
    """A size Dynamo passes as an int input is read from its tensor: the kiln graph takes tensors."""
    class Fold(torch.nn.Module):
        def forward(self, x):
            b, t, c = x.shape
            return x.reshape(b * t, c).softmax(-1).reshape(b, t, c) * t
    rec = Recorder()
    cm = torch.compile(Fold(), backend=rec, dynamic=True)
    for shape in [(2, 3, 4), (5, 2, 4)]:
        x = torch.randn(shape)
        torch.testing.assert_close(cm(x), Fold()(x))
    (g,) = rec.graphs
    assert g.compiles == 1
    compiled = g.entries[0][1]
    assert [i.kind for i in compiled.inputs] == ["tensor"]


def test_parameters_changed_in_place_are_seen():
    m = torch.nn.Linear(4, 2).eval()
    cm = torch.compile(m, backend="kiln")
    x = torch.randn(3, 4)
    with torch.no_grad():
        cm(x)
        m.weight.mul_(2)
        torch.testing.assert_close(cm(x), m(x))


def test_autograd_is_refused_with_the_fix_named():
    m = torch.nn.Linear(4, 2)
    cm = torch.compile(m, backend="kiln")
    with pytest.raises(Exception, match="torch.no_grad"):
        cm(torch.randn(3, 4))
    with torch.inference_mode():
        assert cm(torch.randn(3, 4)).shape == (3, 2)


def test_symbolic_batch_and_sequence_through_a_transformer():
    from tests.frontends.torch.zoo import MODELS
    torch.manual_seed(0)
    m, ins = MODELS["gpt"]()
    m.eval()
    b, s = torch.export.Dim("b"), torch.export.Dim("s", max=32)
    cm = kiln.compile(m, example_inputs=ins, dynamic_shapes=({0: b, 1: s},))
    assert cm.inputs[0].shape == ("b", "s")
    for shape in [(1, 5), (3, 11)]:
        ids = torch.randint(0, 100, shape)
        with torch.no_grad():
            torch.testing.assert_close(cm(ids), m(ids), rtol=1e-3, atol=1e-4)


def test_kiln_bench_takes_a_python_file(tmp_path):
    from kiln.bench_torch import bench_torch_file
    path = tmp_path / "net.py"
    path.write_text("import torch\n"
                    "model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))\n"
                    "example_inputs = (torch.randn(3, 8),)\n")
    res = bench_torch_file(str(path), peers=("torch",), threads=1, runs=2)
    assert res.checks["torch"]["ok"]
    assert set(res.times) == {"kiln", "torch"}
    with pytest.raises(KilnError, match="choose from"):
        bench_torch_file(str(path), peers=("ort",), runs=1)
