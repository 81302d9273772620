"""A MatMul against a shared weight with its batch rows folded into one GEMM (kiln.lower.gemm
`_flat_rows`) under symbolic batch, sequence and head dims (shapes="generic": one module runs
every size) and over two batch dims, with fused epilogues, against the NumPy reference."""

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import helper, numpy_helper

import kiln
from tests.helpers import property_test

F = onnx.TensorProto.FLOAT
EPILOGUES = ("none", "bias_relu", "bias_gelu", "residual")


def _model(dims: list, k: int, n: int, epilogue: str, seed: int = 0) -> onnx.ModelProto:
    """x[*dims, k] @ w[k, n] followed by `epilogue`; symbolic dims are names."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"])]
    out = "h"
    if epilogue in ("bias_relu", "bias_gelu"):
        nodes += [helper.make_node("Add", ["h", "b"], ["hb"]),
                  helper.make_node("Relu", ["hb"], ["y"]) if epilogue == "bias_relu" else
                  helper.make_node("Gelu", ["hb"], ["y"], domain="")]
        out = "y"
    elif epilogue == "residual":   # h + x[..., :n] needs n == k: a second product back to k
        w2 = (rng.standard_normal((n, k)) / np.sqrt(n)).astype(np.float32)
        inits.append(numpy_helper.from_array(w2, "w2"))
        nodes += [helper.make_node("MatMul", ["h", "w2"], ["h2"]), helper.make_node("Add", ["h2", "x"], ["y"])]
        out = "y"
    g = helper.make_graph(nodes, "fold", [helper.make_tensor_value_info("x", F, [*dims, k])],
                          [helper.make_tensor_value_info(out, F, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])


def _folds(monkeypatch) -> list:
    """Every GEMM's (Gemm.flat, Gemm.dot) while compiling (kiln.lower.matmul builds them)."""
    import kiln.lower.matmul as lm
    seen, real = [], lm.build_gemm

    def spy(a, b, **kw):
        g = real(a, b, **kw)
        seen.append((g.flat, g.dot))
        return g
    monkeypatch.setattr(lm, "build_gemm", spy)
    return seen


@property_test(12, 3, settings={"deadline": None},
               heads=st.booleans(), k=st.integers(1, 40), n=st.integers(1, 70),
               epilogue=st.sampled_from(EPILOGUES), sizes=st.lists(
                   st.tuples(st.sampled_from([1, 2, 3, 5, 7, 13]), st.sampled_from([1, 2, 3, 11, 17])),
                   min_size=3, max_size=4))
def test_folded_rows_under_symbolic_dims(heads, k, n, epilogue, sizes):
    """[batch, (heads,) seq, k] @ [k, n] + epilogue, every dim but k symbolic: the batch dims
    fold into the rows (symbolic M too), and one module matches the reference at every size,
    1 and primes included."""
    import pytest
    mp = pytest.MonkeyPatch()
    try:
        seen = _folds(mp)
        dims = ["batch", *(["heads"] if heads else []), "seq"]
        model = _model(dims, k, n, epilogue)
        m = kiln.compile(model, shapes="generic")
    finally:
        mp.undo()
    assert m.shapes == "generic"
    # every batch dim folds (a single-column product, a dot per row, has no tiles to fold)
    assert seen and all(f == len(dims) - 1 for f, dot in seen if not dot), seen
    ref = kiln.compile(model, target="interpreter", opt_level=0)
    rng = np.random.default_rng(k * 100 + n)
    for b, s in sizes:
        x = rng.standard_normal((b, *((3,) if heads else ()), s, k)).astype(np.float32)
        got, want = m.run({"x": x}), ref.run({"x": x})
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4, err_msg=f"{(b, s)}")


def test_folded_accumulator_is_one_tile_and_its_addresses_divide_nothing():
    """Under symbolic dims the folded GEMM's accumulator is one micro-tile of rows (not every
    row: `f % R` in its index made that), and the loads of x and the stores of y are a
    row-major address of the fused row (the digits f // seq, f % seq joined back): no
    division or modulo is left inside a tile (only the tile loop's split into its digits)."""
    from kiln.codegen.fork_cost import calibrated
    from kiln.compiler import frontend, level_of, optimize
    from kiln.loops import stmt as S
    from kiln.codegen.cvector import _flat
    from kiln.loops import simplify
    from kiln.loops.expr import walk
    from kiln.lower.generic import lower_generic
    from kiln.targets.target import Target

    model = _model(["batch", "heads", "seq"], 24, 40, "bias_relu")
    opt = optimize(frontend(model), level_of(None), calibrated(Target.of(None)), {})
    funcs = [f for f in lower_generic(opt.graph, opt.target, {}).lowered.module.funcs
             if any(isinstance(s, S.Allocate) and s.buffer.name.endswith(".acc") for s in S.walk_stmts(f.body))]
    assert funcs
    for f in funcs:
        accs = [s.buffer for s in S.walk_stmts(f.body) if isinstance(s, S.Allocate) and s.buffer.name.endswith(".acc")]
        assert all(b.shape[-2] <= 16 for b in accs), [b.shape for b in accs]
        # the addresses the C code computes (kiln.codegen: a load's or store's row-major
        # offset, simplified) for the kernel's arrays (not its local accumulator)
        addrs = []
        for s in S.walk_stmts(f.body):
            if isinstance(s, S.Store):
                addrs += [(s.buffer, s.indices)] + [(e.arg, e.args) for e in walk(s.value) if e.op == "load"]
        addrs = [simplify(_flat(buf, idx)) for buf, idx in addrs if buf.scope != "local"]
        assert addrs
        # a division may split the tile loop (outermost) into its panel and row-block digits,
        # once per tile; none may divide what a loop inside the tile (rows, k, columns) varies
        tiles = {s.var for s in S.walk_stmts(f.body) if isinstance(s, S.For) and any(
            isinstance(a, S.Allocate) and a.buffer.name.endswith(".acc") for a in S.walk_stmts(s.body))}
        divs = [e for a in addrs for e in walk(a) if e.op in ("floordiv", "floormod")
                and any(v.op == "var" and v.arg.kind != "symbol" and v not in tiles for v in walk(e))]
        assert not divs, (f.name, divs[:2])
